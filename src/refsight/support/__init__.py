"""Small shared mechanisms, on the ground floor (they import nothing of refsight above :mod:`refsight.errors`).

* :mod:`~refsight.support.environment` – the defaults the ``REFSIGHT_*`` environment variables set;
* :mod:`~refsight.support.extras` – an optional extra's install line, and ``require``;
* :mod:`~refsight.support.threads` – the thread budget: torch's threads shared out, llama.cpp's one team;
* :mod:`~refsight.support.plugins` – what the model and embedder registries share: entry points and factories;
* :mod:`~refsight.support.torchvision_cpu` – torchvision's stand-in where only its CUDA wheel would install;
* :mod:`~refsight.support.timing` – stage timers, progress bars and the ``StageTicker``;
* :mod:`~refsight.support.locks` – keyed locks and a read-write lock;
* :mod:`~refsight.support.atomic` – a file replaced atomically;
* :mod:`~refsight.support.json_memo` – a small JSON memo shared by processes.
"""
