"""The engine's caches over the store: packages and prefix states, each got or built in ONE place.

* :mod:`~refsight.cache.packages` – :class:`~refsight.cache.packages.PackageCache`: the one get-or-encode of
  packages (references durable, candidates in memory, images sent inline by the ``remember_images`` policy);
* :mod:`~refsight.cache.prefix_states` – :class:`~refsight.cache.prefix_states.PrefixStateCache`: the
  reference-prefix (KV) states over the store's ``prefixes`` tier, handed to a backend as its ``PrefixCache``.
"""
