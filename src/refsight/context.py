"""A request's context, resolved once at the library's front door and passed down as ONE value.

Every public method of :class:`~refsight.Engine` starts by resolving its caller's keywords into
a :class:`RequestContext`: the tenant's namespace and the isolation scope that salts its
package keys, the model with its options, and the cache switches. The pipelines and parts
below take that value and never work any of it out again, so

- a namespace becomes a scope in one place (:meth:`Models.context`, with ``share_packages``);
- a package key is derived in one place (:meth:`RequestContext.package_key`; a chat's prompt derives each of its
  keys once, with one fingerprint: ``PackageCache.served_prompt``);
- settings are merged in one place (:meth:`Models.options`: the config file's ``[backend]``,
  then that model's ``[models."NAME"]``, then the explicit options the caller gave);
- ``use_cache`` travels as it was given, down to the backend request; ``prefix_states`` is
  decided here, once: a request gets the prefix-state cache only with packages (``use_cache``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .backends.base import Backend
from .backends.fingerprint_record import EncoderFacts, facts_of, record, recorded
from .backends.options import BackendOptions
from .errors import InvalidInputError
from .package import EncoderFingerprint, package_key
from .settings import Settings
from .inputs.text import check_text

__all__ = ["Models", "RequestContext"]


class Models:
    """The models one engine serves: each loaded once, with its options merged in ONE place."""

    def __init__(self, settings: Settings, explicit: BackendOptions, default: str, *, share_packages: bool) -> None:
        #: The config file's options (``[backend]``, ``[models."NAME"]``).
        self.settings = settings
        #: Options the caller gave (flags, keywords): they win over the file's.
        self.explicit = explicit
        #: The model used when a request names none.
        self.default = default
        #: Whether tenants share packages (else each namespace salts its package keys).
        self.share_packages = share_packages
        self._loaded: dict[str, Backend] = {}
        self._lock = threading.Lock()

    def options(self, model: str) -> BackendOptions:
        """``model``'s options: ``[backend]``, then ``[models."model"]``, then the explicit ones."""
        return self.settings.backend_options(model, self.explicit)

    def backend(self, model: str | None = None) -> Backend:
        """The backend for ``model`` (default: :attr:`default`), loaded on first use."""
        from .backends.registry import get_backend

        name = model or self.default
        backend = self._loaded.get(name)
        if backend is None:
            # Loaded outside the lock: a request for a model already served never waits on another's load
            # (the registry builds each backend once, so two first requests get the same one).
            options = self.options(name).as_kwargs()
            backend = get_backend(name, **options)
            with self._lock:
                backend = self._loaded.setdefault(name, backend)
            _record(name, options, backend)
        return backend

    def known_facts(self, model: str | None = None) -> EncoderFacts | None:
        """``model``'s fingerprint, batch size and backend name without loading it: the loaded backend's, else
        those recorded at its last load while its files are unchanged (:mod:`refsight.backends.fingerprint_record`);
        None when only a load can tell."""
        name = model or self.default
        backend = self._loaded.get(name)
        if backend is not None:
            return facts_of(backend)
        return recorded(name, self.options(name).as_kwargs())

    def provide(self, name: str, backend: Backend) -> Backend:
        """Serve ``backend`` under ``name`` in this engine alone (nothing enters the process-wide registry)."""
        with self._lock:
            self._loaded[name] = backend
        return backend

    def context(
        self, namespace: str, model: str | None = None, *, use_cache: bool = True, prefix_states: bool = True
    ) -> RequestContext:
        """The context of one request by ``namespace``: its scope, ``model`` (default: :attr:`default`), the switches."""
        if not isinstance(namespace, str) or not namespace:
            raise InvalidInputError("namespace", f"must be a non-empty string, not {namespace!r}")
        check_text(namespace, "namespace")
        if model is not None and (not isinstance(model, str) or not model):
            raise InvalidInputError("model", f"must be a model name, not {model!r}")
        for name, value in (("use_cache", use_cache), ("prefix_states", prefix_states)):
            if not isinstance(value, bool):
                raise InvalidInputError(name, f"must be true or false, not {value!r}")
        return RequestContext(
            namespace=namespace, scope=None if self.share_packages else namespace, model=model or self.default,
            models=self, use_cache=use_cache, prefix_states=use_cache and prefix_states,
        )

    def unload(self, model: str | None = None) -> bool:
        """Close ``model``'s backend (default: :attr:`default`) and forget it, so its memory is freed; the next
        use loads it again. False when it was not loaded. The caller makes sure no request is using it."""
        from .backends.registry import release_backend

        with self._lock:
            backend = self._loaded.pop(model or self.default, None)
        if backend is None:
            return False
        release_backend(backend)
        return True

    def is_loaded(self, model: str | None = None) -> bool:
        """Whether ``model``'s backend (default: :attr:`default`) is loaded already (nothing is loaded for this)."""
        with self._lock:
            return (model or self.default) in self._loaded

    def loaded(self) -> list[Backend]:
        """The backends loaded so far (nothing is loaded for this)."""
        with self._lock:
            return list(self._loaded.values())


def _record(name: str, options: dict, backend: Backend) -> None:
    """Record a fresh load's fingerprint for commands that need no model; a failure only costs their next load."""
    try:
        record(name, options, backend)
    except OSError:
        pass  # a model directory that changed under the load: nothing sound to record


@dataclass(frozen=True)
class RequestContext:
    """Who asks, with which model, under which cache switches (see the module docstring)."""

    #: The tenant's namespace: the references it sees.
    namespace: str
    #: What salts the tenant's package keys (None when tenants share packages).
    scope: str | None
    #: The model's registry name.
    model: str
    #: Where the backend comes from (loaded once per engine).
    models: Models = field(repr=False, compare=False)
    #: Packages (True) or pixels, the runtime's own fresh path (False).
    use_cache: bool = True
    #: Reuse stored reference-prefix states (the language model's state after the references): the
    #: caller did not opt out, and packages are used (pixels give no package keys to key a state by).
    prefix_states: bool = True

    def backend(self) -> Backend:
        """The model's backend, loaded by the first call (a bulk ingest's driver never calls: its workers load it)."""
        return self.models.backend(self.model)

    def known_facts(self) -> EncoderFacts | None:
        """The model's fingerprint, batch size and backend name when known without a load (see :meth:`Models.known_facts`)."""
        return self.models.known_facts(self.model)

    @property
    def options(self) -> BackendOptions:
        """The model's merged options (what an ingest worker loads the backend with)."""
        return self.models.options(self.model)

    def package_key(self, image_sha256: str, fingerprint: EncoderFingerprint | None = None) -> str:
        """The key of ``image_sha256``'s package in this context (``fingerprint``: the backend's, unless given)."""
        return package_key(image_sha256, fingerprint or self.backend().fingerprint(), self.scope)
