"""``refsight serve``: the HTTP API and the page, from the optional ``[server]`` extra.

It takes the flags llama-server and ``vllm serve`` users type (``refsight serve MODEL``, ``-m``,
``--mmproj``, ``--api-key``, ``--served-model-name``/``--alias``, ``-c``/``--ctx-size``/``--max-model-len``,
``-np``/``--parallel``, ``-fa``/``--flash-attn``), every other flag of llama-server's command line with the status
:mod:`.llama_flag_table` gives it, and loads the model before it binds the port.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from .arguments import EMBEDDER_HELP, Command, UsageError, path_argument, text_argument
from ..support.environment import default_model
from ..support.extras import install_command
from .command import backend_options, say, settings_of
from ..settings import BackendOptions
from .llama_flags import (
    add_llama_server_arguments, add_table_flags, api_keys, apply_environment, chat_template, llama_server_settings,
    log_table_flags, mtmd_settings, slot_context, table_verdicts,
)

__all__ = ["COMMANDS"]

#: The model-name prefix of a GGUF file (the llama.cpp backend's; cli/ names no backend module).
_LLAMACPP = "llamacpp:"
#: The model names llama.cpp serves: a GGUF file, a model of Ollama's store.
_LLAMA_CPP_NAMES = (_LLAMACPP, "ollama:")


def _slots_arguments(p: argparse.ArgumentParser) -> None:
    """llama-server's ``--slots``/``--no-slots`` (whether ``GET /slots`` is served) and ``-v``/``--verbose``."""
    p.add_argument("-v", "--verbose", "--log-verbose", action="store_true", help="log at debug level (as llama-server's -v)")
    p.add_argument("--slots", dest="slots_endpoint", action="store_true", default=True,
                   help="serve GET /slots (the default, as llama-server's)")
    p.add_argument("--no-slots", dest="slots_endpoint", action="store_false",
                   help="no GET /slots: it answers 501, as llama-server's --no-slots")


def _listen_arguments(p: argparse.ArgumentParser) -> None:
    """Where the server listens and whom it answers: ``--host``, ``--port``, ``--cors-origins``, ``--allowed-hosts``."""
    p.add_argument("--host", default="127.0.0.1", help=(
        "address(es) to bind, comma-separated as llama-server's (127.0.0.1,::1); non-loopback needs API keys"))
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--cors-origins", default=None, metavar="ORIGINS",
        help="origins allowed cross-origin, comma-separated (* for any; localhost: every loopback origin, as "
             "llama-server's localhost mode; an empty value: none; default: * with API keys, as llama-server's, "
             "localhost without)",
    )
    p.add_argument(
        "--allowed-hosts", default="", metavar="NAMES",
        help="without API keys, Host names served beside loopback and --host, comma-separated",
    )


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    # The spellings llama-server and `vllm serve` users type: MODEL, -m, --api-key, --alias, -c.
    p.add_argument(
        "model_arg", nargs="?", metavar="MODEL",
        help="the model (as --model; a .gguf file: llama.cpp; ollama:NAME[:TAG]: a model of Ollama's store)",
    )
    p.add_argument("-m", dest="model_file", metavar="MODEL", help="the model, as llama-server's -m (a .gguf file: llama.cpp)")
    p.add_argument(
        "--api-key", metavar="KEY", action="append",
        help="API key(s) for the default namespace: repeat the flag or separate keys by commas (default: $REFSIGHT_API_KEY)",
    )
    add_llama_server_arguments(p)
    p.add_argument(
        "--served-model-name", "--alias", "-a", dest="served_model_names", nargs="+", metavar="NAME",
        help="the name(s) clients send as model, space- or comma-separated (the first is shown in replies)",
    )
    p.add_argument(
        "-c", "--ctx-size", dest="ctx_size", type=int, metavar="N",
        help="context size in tokens, where the runtime has a limit (llama.cpp); a slot's context above the model's "
             "trained one is capped at it with a warning, as llama-server's",
    )
    p.add_argument("--max-model-len", dest="max_model_len", type=int, metavar="N",
                   help="as -c, vLLM's spelling: above the model's trained context it is refused, as vLLM's")
    _listen_arguments(p)
    p.add_argument(
        "-np", "--parallel", dest="parallel", type=int, metavar="N",
        help="requests decoded together, each its own sequence (llama.cpp, as llama-server's -np; default 1)",
    )
    p.add_argument(
        "-fa", dest="flash_attn", type=text_argument, default=None, metavar="on|off|auto",
        help="llama.cpp's flash attention, as llama-server's -fa (= --flash-attn; default auto, off with --parallel)",
    )
    _slots_arguments(p)
    p.add_argument("--workers", type=int, default=None, help="threads running model work (default: 2, or --parallel: -np 1 is one)")
    p.add_argument("--keys", metavar="FILE", type=path_argument, help="API keys, one KEY=NAMESPACE a line (default: $REFSIGHT_API_KEYS)")
    p.add_argument("--share-packages", action="store_true", help=(
        "share packages across tenants (fewer encodes, but timing reveals that some tenant holds an image)"))
    p.add_argument("--embedder", default=None, metavar="NAME", help=EMBEDDER_HELP)
    p.add_argument(
        "--max-prompt-tokens", type=int, default=8192, metavar="N",
        help="most tokens a chat prompt may hold, its images' tokens included (default 8192); longer prompts get 400",
    )
    p.add_argument(
        "--no-cache", action="store_true",
        help="encode every image afresh and prefill every prompt whole (no package or prefix reuse: a baseline)",
    )
    _remember_images_argument(p)
    p.add_argument(
        "--attributes", choices=("imagenet", "vlm", "none"), default="imagenet",
        help="attribute record computed when a reference is added over HTTP (default: imagenet; none: skip)",
    )
    add_table_flags(p)  # llama-server's other flags: last, so it registers only the spellings parsed nowhere else
    p.epilog = ("llama-server's other flags are taken too: accepted where they cannot change an answer here (the "
                "startup log names them), recorded for the server, or refused by name (the CLI reference lists each)")


def _remember_images_argument(p: argparse.ArgumentParser) -> None:
    from ..settings import REMEMBER_IMAGES  # the policy's values (refsight.settings.remembering), through the public face

    p.add_argument(
        "--remember-images", choices=REMEMBER_IMAGES, default=None,
        help="what the store keeps of images sent inline: recurring (the default: an image a tenant sends again; "
             "its package, never its bytes), all, or off (nothing; default: $REFSIGHT_REMEMBER_IMAGES, else "
             "[store] remember_images in refsight.toml)",
    )


def _server_extra_missing() -> str | None:
    """The module of the ``[server]`` extra that is not installed, or None."""
    try:
        import fastapi  # noqa: F401
        import multipart  # noqa: F401  (python-multipart)
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return exc.name or str(exc)
    return None


def _model(args: argparse.Namespace) -> str | None:
    """The one model named by MODEL, -m or --model (a path to a .gguf file is served by llama.cpp)."""
    named = {name for name in (args.model_arg, args.model_file, args.model) if name}
    if len(named) > 1:
        raise UsageError(f"the model is named twice ({', '.join(sorted(named))}); give MODEL, -m or --model once")
    model = next(iter(named), None)
    if model is not None and model.endswith(".gguf") and not model.startswith(_LLAMACPP):
        return _LLAMACPP + model
    return model


def _router_mode_settings(args: argparse.Namespace) -> None:
    """llama-server started with no model is a router, and its ``-c``/``-np`` are the settings of the models it loads
    later (llama.cpp's own suite starts it so). refsight loads no model later: it serves its default model, and where
    that one takes no context or slots (not llama.cpp's) the two are left out, named in the startup log."""
    given = {"-c": args.ctx_size, "-np": args.parallel}
    given = {flag: value for flag, value in given.items() if value is not None}
    default = default_model()
    if _model(args) is not None or not given or default.startswith(_LLAMA_CPP_NAMES) or args.max_model_len is not None:
        return  # (with vLLM's --max-model-len too: not a llama-server command line, and -c with it is refused)
    typed = ", ".join(f"{flag} {value}" for flag, value in given.items())
    say(f"refsight serve: llama-server's {typed} with no model: router mode's settings for the models it loads later; "
        f"refsight serves its default model {default}, which takes neither: not applied")
    args.ctx_size = args.parallel = None


def vertex_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Vertex AI's environment, read as llama-server reads it: with ``AIP_MODE=PREDICTION`` the predict route
    (``AIP_PREDICT_ROUTE``, default ``/predict``), the health route (``AIP_HEALTH_ROUTE``), and ``AIP_HTTP_PORT`` in
    place of ``--port`` (named in the startup log)."""
    if os.environ.get("AIP_MODE", "") != "PREDICTION":
        return {}
    port = os.environ.get("AIP_HTTP_PORT", "8080")
    if not port.isdigit():
        raise UsageError(f"AIP_HTTP_PORT={port}: give a port number")
    if int(port) != args.port:
        say(f"refsight serve: Vertex AI (AIP_MODE=PREDICTION): serving on AIP_HTTP_PORT {port}, not --port {args.port}")
        args.port = int(port)
    return {"vertex_predict_route": os.environ.get("AIP_PREDICT_ROUTE") or "/predict",
            "vertex_health_route": os.environ.get("AIP_HEALTH_ROUTE") or None}


def _backend_options(args: argparse.Namespace) -> BackendOptions:
    """The backend options the flags set: the model options, then llama-server's context, slots, template, images."""
    options = backend_options(args)
    if args.ctx_size is not None and args.max_model_len is not None:
        raise UsageError("-c/--ctx-size and --max-model-len both give the context; give one")
    context = slot_context(args)
    if context is not None:
        options = dataclasses.replace(options, n_ctx=context)
    if args.ctx_size is not None and (_model(args) or "").startswith(_LLAMA_CPP_NAMES):
        # llama-server's -c: a slot above the trained context is capped, with a warning
        options = dataclasses.replace(options, n_ctx_over_trained="cap")
    if args.parallel is not None:
        options = dataclasses.replace(options, parallel=args.parallel)
    template = chat_template(args)
    if template is not None:
        options = dataclasses.replace(options, chat_template=template)
    if args.jinja is False:
        options = dataclasses.replace(options, jinja=False)
    if mtmd_settings(args):
        options = dataclasses.replace(options, processor_kwargs={**options.processor_kwargs, **mtmd_settings(args)})
    return options


def cmd_serve(args: argparse.Namespace) -> int:
    """refsight serve [MODEL] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--alias NAME] [-c N] [--keys FILE] ..."""
    # Without the extra, say how to get it (exit 2, a usage-level error) instead of an ImportError traceback.
    missing = _server_extra_missing()
    if missing is not None:
        print(
            f"refsight: error: `refsight serve` needs the server extra ({missing} is not installed): "
            f"{install_command('server')}",
            file=sys.stderr,
        )
        return 2
    from ..server import ServerConfig, serve

    # A refused llama-server flag: exit 2 before anything loads; the accepted and recorded ones are logged.
    verdicts = table_verdicts(args)
    _router_mode_settings(args)
    llama_settings = {**llama_server_settings(args), **vertex_settings(args)}
    options = _backend_options(args)
    keys = api_keys(args)
    # A template is tried at load (compiled, rendered once under the renders' bounds): one that cannot serve, or one
    # no built-in format matches without Jinja, is one line naming the flag that gave it, exit 2.
    flag = "--chat-template" if args.chat_template_file is None else f"--chat-template-file {args.chat_template_file}"
    args.fields = {**args.fields, "chat_template": flag if options.chat_template is not None else "--no-jinja",
                   "jinja": "--no-jinja"}
    log_table_flags(verdicts)
    apply_environment(args)
    # N slots need N requests reaching the model at once, and -np 1 is one slot (llama-server's /slots).
    workers = args.workers if args.workers is not None else (args.parallel or 2)
    if args.parallel is not None and workers < args.parallel:
        raise UsageError(f"--workers {workers} is below --parallel {args.parallel}: the slots could never all be busy")
    # serve() applies the thread budget (refsight.support.threads): torch's threads are the cores shared out among the
    # workers, llama.cpp's (one thread team at a time) --threads or every core.
    # serve() loads and checks the model before it binds the port: a bad model or option is
    # a RefsightError here, one line and exit 1 (cli.main), with no server started.
    serve(ServerConfig(
        store=args.store, catalog=args.catalog, local_dir=args.local_dir, model=_model(args),
        backend_options=options, settings=settings_of(args), config_file=args.config,
        host=args.host, port=args.port, workers=workers, threads=args.threads, keys_file=args.keys, share_packages=args.share_packages,
        api_key=keys, served_model_names=_aliases(args.served_model_names),
        embedder=args.embedder, max_prompt_tokens=args.max_prompt_tokens,
        ingest_attributes=() if args.attributes == "none" else (args.attributes,),
        redis=args.redis, max_package_bytes=args.max_package_bytes, local_cache_bytes=args.local_cache_bytes,
        use_cache=not args.no_cache,
        remember_images=args.remember_images, slots_endpoint=args.slots_endpoint, verbose=args.verbose,
        cors_origins=None if args.cors_origins is None else _names(args.cors_origins), allowed_hosts=_names(args.allowed_hosts), **llama_settings,
    ))
    return 0


def _aliases(values: list[str] | None) -> tuple[str, ...]:
    """The served names: each value split at commas (llama-server's ``--alias a,b``), in order, once each."""
    return tuple(dict.fromkeys(name for value in values or () for name in _names(value)))


def _names(value: str) -> tuple[str, ...]:
    """A comma-separated flag value as its non-empty names."""
    return tuple(name.strip() for name in value.split(",") if name.strip())


COMMANDS = (Command("serve", "serve the HTTP API and the page (FastAPI on uvicorn)", cmd_serve, _serve_arguments, model=True),)
