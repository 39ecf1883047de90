"""``tensorwire.server``: the parameter-server side of data-parallel training.

It owns the server shard (:mod:`.ps`: gradients in, optimizer step, fresh parameters written
one-sidedly into every worker), the sharding plan both ends derive their tensor names from
(:mod:`.plan`), the optimizers (:mod:`.optim`), checkpoints (:mod:`.checkpoint`), and the
``tensorwire-ps`` daemon with its configuration (:mod:`.daemon`, :mod:`.config`,
:mod:`.progress`). Built only on the public API of :mod:`tensorwire`.
"""
