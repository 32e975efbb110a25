"""The render worker's program: chat templates compiled and rendered in a bounded Jinja sandbox.

A chat template is code from the operator (``--chat-template``) or from a model file someone downloaded (a GGUF's
``tokenizer.chat_template``, a checkpoint's). Jinja's :class:`~jinja2.sandbox.ImmutableSandboxedEnvironment` keeps
it from reaching Python; this module also keeps it from costing more than its input justifies:

- every value an operator makes (``*``, ``+``, ``%``, ``**``: Jinja's ``intercepted_binops``) is sized before it is
  made and refused past the render's ``limit`` (characters, items; integers past :data:`MAX_INT_BITS` bits), and
  intercepted operators are never folded at compile time (Jinja's optimizer leaves them to the render);
- filters are never folded at compile time either (each is wrapped as a context filter, which Jinja's optimizer
  leaves alone): ``{{ 'x' | center(10**9) }}`` costs nothing to compile; at the render, a call (filter or method)
  with an integer argument past the limit is refused before it runs, and every result past the limit after;
- the output is counted as it is written and refused past the limit.

What no rule here can size (a loop of 1e10 steps, a string doubled with ``~``) is bounded by the process this runs
in: :mod:`.workers` kills it at the render's deadline, and its address space is capped (``RLIMIT_AS``), so a huge
allocation is a ``MemoryError`` here, never memory of the server's.

Two **flavours**, each the environment one of refsight's paths rendered in before (byte-identical output for every
template that rendered there): ``llama.cpp`` (the GGUF path's own: ``trim_blocks``, ``lstrip_blocks``,
``raise_exception``; and what llama.cpp's own Jinja engine has beyond it, which llama-server's templates are written
for: ``{% break %}``/``{% continue %}`` (Jinja's ``loopcontrols``), ``strftime_now``, and an undefined name read as
nothing: an attribute of it is undefined too, and ``+`` with a string is the string) and ``transformers``
(``apply_chat_template``'s: also ``loopcontrols``, the ``{% generation %}`` tag, its ``tojson``, ``strftime_now``,
``dict`` and ``namespace``).

It imports only the standard library and Jinja, and runs as a script (``python -I sandbox.py MEMORY_BYTES``): one
request at a time, as length-prefixed JSON frames on stdin, one reply each on stdout (JSON both ways: a reply is
data, never code the server would run).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import string
import struct
import sys
import threading
from datetime import datetime
from typing import Any, Callable

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["BoundError", "FLAVOURS", "MAX_INT_BITS", "compile_template", "render", "handle", "main"]

#: The most bits an integer a template makes may have (``2 ** 4096`` and up are refused before they are computed).
MAX_INT_BITS = 4096
#: A frame's length prefix: 4 bytes, big-endian.
_HEADER = struct.Struct(">I")
#: One ``%`` conversion: its width and precision (digits, or ``*`` read from the arguments).
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


class BoundError(Exception):
    """A template made (or was about to make) a value or an output past its render's bound."""


def _raise_value_error(message: str) -> None:
    raise ValueError(message)


def _raise_template_error(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    # transformers' tojson: no HTML escaping, and its options exposed.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _LlamaUndefined(jinja2.ChainableUndefined):
    """llama.cpp's undefined value (``common/jinja/runtime.cpp``): printed and iterated as nothing, an attribute or
    item of it undefined too, and joined to a string by ``+`` as the empty string (firefunction's
    ``suffix + "\\n" + functions`` where no ``functions`` is given). Anything else done with it still fails."""

    __slots__ = ()

    def __add__(self, other: Any) -> Any:
        if isinstance(other, str):
            return other
        return super().__add__(other)

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, str):
            return other
        return super().__radd__(other)


class _TemplateDict:
    """transformers' ``dict`` global: builds dicts, and nothing of the dict class is reachable through it."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """transformers' ``namespace``: Jinja's, refusing underscore-prefixed attributes."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's Namespace signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute."
            )


class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}``: renders its body (it marks the answer's tokens
    only when asked for an assistant mask, which refsight never is)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


#: Flavour → (extensions, globals, filters, undefined): the environment each of refsight's rendering paths used.
FLAVOURS: dict[str, tuple[tuple[Any, ...], dict[str, Any], dict[str, Any], type[jinja2.Undefined]]] = {
    "llama.cpp": ((jinja2.ext.loopcontrols,), {"raise_exception": _raise_value_error, "strftime_now": _strftime_now},
                  {}, _LlamaUndefined),
    "transformers": (
        (_GenerationTag, jinja2.ext.loopcontrols),
        {"raise_exception": _raise_template_error, "strftime_now": _strftime_now, "dict": _TemplateDict(),
         "namespace": _TemplateNamespace},
        {"tojson": _tojson},
        jinja2.Undefined,
    ),
}


def _size(value: Any) -> int:
    """How big a value is for the bound: characters or items (bits over 64 for an integer count as that many)."""
    if isinstance(value, (str, bytes, list, tuple, dict)):
        return len(value)
    return 0


def _check_int(value: Any) -> None:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise BoundError(f"made an integer of {value.bit_length()} bits, over the bound of {MAX_INT_BITS}")


def _product_size(left: Any, right: Any) -> int:
    """The size ``left * right`` would have: a sequence repeated, or an integer's bits."""
    if isinstance(left, int) and isinstance(right, int):
        return 0 if left.bit_length() + right.bit_length() <= MAX_INT_BITS else -1
    for sequence, count in ((left, right), (right, left)):
        if isinstance(count, int) and not isinstance(sequence, (int, float)):
            return _size(sequence) * max(count, 0)
    return 0


def _power_bits(left: Any, right: Any) -> int:
    if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        return int(right * math.log2(abs(left))) + 1
    return 0


def _format_widths(fmt: str, args: Any) -> list[int]:
    """Every width and precision ``fmt % args`` would pad to (``*`` taken from the arguments)."""
    numbers = [int(n) for spec in _PERCENT_SPEC.findall(fmt) for n in spec if n and n != "*"]
    if "*" in fmt and isinstance(args, (tuple, list)):
        numbers += [a for a in args if isinstance(a, int)]
    return numbers


def _spec_widths(fmt: str) -> list[int]:
    """Every number in the format specs of a ``str.format`` string (its widths and precisions)."""
    try:
        specs = [spec for _, _, spec, _ in string.Formatter().parse(fmt) if spec]
    except ValueError:
        return []  # str.format will say what is wrong with it
    return [int(n) for spec in specs for n in re.findall(r"\d+", spec)]


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with every value sized against :attr:`limit` (set before each render)."""

    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The most characters (or items) any value, and the output, may have in the render under way.
        self.limit = 1 << 20

    def bounded(self, value: Any) -> Any:
        """``value``, or BoundError when it is past the limit."""
        if _size(value) > self.limit:
            raise BoundError(f"made a value of {_size(value)} characters or items, over the bound of {self.limit}")
        _check_int(value)
        return value

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """The operator's result, sized first where it could be huge (repetition, powers, padded formats)."""
        if operator == "*":
            size = _product_size(left, right)
            if size < 0 or size > self.limit:
                raise BoundError(f"'*' would make a value past the bound of {self.limit} characters or items "
                                 f"(or {MAX_INT_BITS} bits)")
        elif operator == "**" and _power_bits(left, right) > MAX_INT_BITS:
            raise BoundError(f"'**' would make an integer of over {MAX_INT_BITS} bits, the bound of an integer")
        elif operator == "%" and isinstance(left, str):
            self.check_widths(_format_widths(left, right))
        elif operator == "+" and _size(left) + _size(right) > self.limit:
            raise BoundError(f"'+' would make a value past the bound of {self.limit} characters or items")
        return self.bounded(super().call_binop(context, operator, left, right))

    def check_widths(self, widths: list[int]) -> None:
        """BoundError when a format would pad past the limit."""
        widest = max(widths, default=0)
        if widest > self.limit:
            raise BoundError(f"a format pads to {widest} characters, over the bound of {self.limit}")

    def check_arguments(self, args: tuple, kwargs: dict) -> None:
        """BoundError for an integer argument past the limit (a width, a count): refused before the call runs."""
        for value in (*args, *kwargs.values()):
            if isinstance(value, int) and not isinstance(value, bool) and value > self.limit:
                raise BoundError(f"an argument of {value} is over the bound of {self.limit}")

    def wrap_str_format(self, value: Any) -> Any:
        """Jinja's sandboxed ``str.format``, refused when the string's format specs, or the integers it is
        given (a nested width: ``'{0:{1}}'``), pad past the limit."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        self.check_widths(_spec_widths(value.__self__))

        def bounded_format(*args: Any, **kwargs: Any) -> str:
            self.check_arguments(args, kwargs)
            return wrapped(*args, **kwargs)

        return bounded_format

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's own names
        """A sandboxed call with its result bounded; a string method's integer arguments (a width, a count) are
        bounded before it runs."""
        if isinstance(getattr(__obj, "__self__", None), str):
            __self.check_arguments(args, kwargs)
        return __self.bounded(super().call(__context, __obj, *args, **kwargs))


def _unfolded(env: BoundedEnvironment, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` as a context filter: Jinja never folds those at compile time, so a filter runs only in a
    render, where its arguments and its result are bounded. It gets what it asked Jinja for (the context, the
    evaluation context, the environment), as before."""
    passes = getattr(function, "jinja_pass_arg", None)
    kind = getattr(passes, "name", None)

    @jinja2.pass_context
    def bounded_filter(context: Any, *args: Any, **kwargs: Any) -> Any:
        env.check_arguments(args[1:], kwargs)
        if function is jinja2.filters.do_format and args and isinstance(args[0], str):
            env.check_widths(_format_widths(args[0], args[1:]))
        first = {"context": (context,), "eval_context": (context.eval_ctx,), "environment": (context.environment,)}
        return env.bounded(function(*first.get(kind, ()), *args, **kwargs))

    return bounded_filter


@functools.lru_cache(maxsize=4)
def environment(flavour: str) -> BoundedEnvironment:
    """The bounded environment of ``flavour`` (one per flavour in a worker)."""
    extensions, globals_, filters, undefined = FLAVOURS[flavour]
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=list(extensions), undefined=undefined)
    env.globals.update(globals_)
    env.filters.update(filters)
    env.filters.update({name: _unfolded(env, function) for name, function in env.filters.items()})
    return env


@functools.lru_cache(maxsize=8)
def compile_template(flavour: str, source: str) -> jinja2.Template:
    """``source`` compiled in ``flavour``'s environment (the last few kept: a server renders one template)."""
    return environment(flavour).from_string(source)


def render(flavour: str, source: str, context: dict[str, Any], limit: int) -> str:
    """``source`` rendered with ``context``; BoundError past ``limit`` characters (the output, or any value)."""
    template = compile_template(flavour, source)
    template.environment.limit = limit
    pieces, total = [], 0
    for piece in template.generate(**context):
        total += len(piece)
        if total > limit:
            raise BoundError(f"wrote more than {limit} characters, the bound of its output")
        pieces.append(piece)
    return "".join(pieces)


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """One request's reply: ``{"text": ...}``, or ``{"error": ...}`` (``"raised": true``: the template's own error;
    ``"retire": true``: this process is spent)."""
    try:
        return {"text": render(request["flavour"], request["template"], request["context"], request["limit"])}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": f"does not compile: {e.message} (line {e.lineno})"}
    except BoundError as e:
        return {"error": str(e)}
    except MemoryError:
        return {"error": "ran out of the memory a render may take", "retire": True}
    except RecursionError:
        return {"error": "recursed too deeply"}
    except Exception as e:  # noqa: BLE001 - the template's own error (raise_exception, an undefined name ...)
        return {"error": f"cannot render this prompt: {type(e).__name__}: {e}", "raised": True}


def read_frame(stream: Any) -> Any:
    """One JSON frame from ``stream``; None at its end."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (length,) = _HEADER.unpack(header)
    body = stream.read(length)
    if len(body) < length:
        return None
    return json.loads(body)


def write_frame(stream: Any, value: Any) -> None:
    """``value`` as one JSON frame on ``stream``."""
    body = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def _watch_parent(parent: int) -> None:
    # A worker outlives no server: once its parent is gone (reparented), it ends, even mid-render.
    while os.getppid() == parent:
        threading.Event().wait(0.5)
    os._exit(0)


def main(argv: list[str]) -> None:
    """Serve render requests on stdin/stdout until stdin ends; the address space capped at ``argv[0]`` bytes."""
    import resource

    memory = int(argv[0])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    write_frame(replies, {"ready": True})
    while (request := read_frame(requests)) is not None:
        reply = handle(request)
        try:
            write_frame(replies, reply)
        except MemoryError:
            os._exit(3)
        if reply.get("retire"):
            os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
