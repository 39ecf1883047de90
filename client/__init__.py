"""``tensorwire.client``: the worker side of data-parallel training.

It owns :class:`~.psclient.PSClient` (a training loop's connection to the parameter servers,
whose parameters *are* registered memory the servers write into), the ``tensorwire-worker``
daemon (:mod:`.worker`), the models and data it trains (:mod:`.models`), and launching a whole
local job (:mod:`.launch`, used by ``make demo`` in :mod:`.demo` and by ``tensorwire bench ps``).
Built only on the public API of :mod:`tensorwire`.
"""
