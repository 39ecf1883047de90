"""What a training job's daemons share: the parameter servers (``tensorwire.server``), the workers
and their client (``tensorwire.client``), the benchmarks that launch them (``tensorwire.bench``)
and ``tensorwire ray-job``.

* :mod:`.plan`: the parameter-server protocol, which both ends derive everything from (how
  parameters are sharded, what every tensor is called, the status word);
* :mod:`.config`: the daemons' flags, TOML file and ``TENSORWIRE_*`` variables, secrets, logging,
  metrics and summaries;
* :mod:`.progress`: progress on a terminal or in logs;
* :mod:`.files`: the files the daemons write (checkpoints, summaries, parameters), checked at
  start and written whole.
* :mod:`.words`: reading the tensors a daemon writes to say something (joins, requests,
  statuses, notices), past the loss notices of a peer's earlier sessions.
* :mod:`.limits`: the open-file limit the daemons raise at start, and what their peers need.
* :mod:`.norms`: gradient norms for ``--clip-grad-norm``, which servers and workers both take.

Neither daemon imports the other: each imports this package and the public API of ``tensorwire``.
"""
