"""A newcomer's mistakes get a message that names them: the bad flag or command with its closest match,
a wrong reference before any model loads, and model text that cannot drive the terminal."""

from __future__ import annotations

import pytest

from refsight.cli import main


def _usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_an_unknown_flag_before_the_command_is_named(capsys):
    err = _usage_error(capsys, "--frobnicate")
    assert "unrecognized arguments: --frobnicate" in err and "required: COMMAND" not in err


def test_an_unknown_flag_of_a_command_gets_that_commands_usage_and_the_closest_flag(capsys, tmp_path):
    err = _usage_error(capsys, "add", "--metta", "k=v", str(tmp_path / "x.jpg"))
    assert err.startswith("usage: refsight add")
    assert "unrecognized arguments: --metta" in err and "did you mean '--meta'?" in err


def test_a_mistyped_command_gets_the_closest_command(capsys):
    err = _usage_error(capsys, "comapre")
    assert "invalid choice: 'comapre'; did you mean 'compare'?" in err


def test_a_mistyped_model_name_gets_the_closest_name(capsys, tmp_path, real_photo):
    image = tmp_path / "cat.png"
    real_photo("chelsea", size=(32, 24)).save(image)
    assert main(["add", str(image), "--model", "tiny-qwen2vl", "--store", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert "did you mean 'tiny-qwen2-vl'" in err and len(err.splitlines()) == 1 and len(err) < 200


@pytest.mark.parametrize("command", [["compare", "IMAGE", "--criteria", "fur"], ["generate", "--prompt", "same?"]])
def test_a_wrong_reference_fails_before_any_model_loads(capsys, tmp_path, real_photo, command, backend_registry):
    from refsight.backends.registry import register_backend

    loads = []
    register_backend("counted-model", lambda **options: loads.append(options))  # any load would be seen here
    image = tmp_path / "new.png"
    real_photo("chelsea", size=(32, 24)).save(image)
    argv = [str(image) if word == "IMAGE" else word for word in command]
    code = main([*argv, "--ref", "nosuchref", "--model", "counted-model", "--store", str(tmp_path / "s")])
    assert code == 1 and "reference not found: 'nosuchref'" in capsys.readouterr().err
    assert loads == []  # the check is a catalog read: no model was asked for


def test_a_mistyped_reference_gets_the_close_ids_and_the_command_that_lists_them(capsys, tmp_path, real_photo):
    image, store = tmp_path / "cat.png", str(tmp_path / "s")
    real_photo("chelsea", size=(32, 24)).save(image)
    assert main(["add", str(image), "--id", "chelsea", "--model", "toy", "--attributes", "none", "--store", store]) == 0
    capsys.readouterr()
    for command in (["show", "chelsae"], ["remove", "chelse"]):
        assert main([*command, "--store", store]) == 1
        err = capsys.readouterr().err
        assert "did you mean 'chelsea'?" in err and "'refsight list' shows the store's references" in err, err
    assert main(["show", "zzz", "--store", store]) == 1
    assert "did you mean" not in (err := capsys.readouterr().err) and "'refsight list'" in err


def test_a_directory_given_to_add_names_ingest_and_a_missing_file_is_named_once(capsys, tmp_path):
    store = str(tmp_path / "s")
    assert main(["add", str(tmp_path), "--model", "toy", "--store", store]) == 1
    err = capsys.readouterr().err
    assert f"run: refsight ingest {tmp_path}" in err and err.count(str(tmp_path)) == 2, err  # the path, the command
    missing = str(tmp_path / "nope.jpg")
    assert main(["add", missing, "--model", "toy", "--store", store]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"refsight: cannot add {missing}: no such file", err


def test_compare_in_an_empty_store_says_so_in_the_commands_words_before_any_model_loads(
    capsys, tmp_path, real_photo, backend_registry
):
    from refsight.backends.registry import register_backend

    loads = []
    register_backend("counted-model", lambda **options: loads.append(options))
    image, store = tmp_path / "new.png", str(tmp_path / "s")
    real_photo("chelsea", size=(32, 24)).save(image)
    base = ["compare", str(image), "--criteria", "fur", "--model", "counted-model", "--store", store]
    assert main([*base, "--top-k", "1"]) == 1
    assert "the store has no references (namespace 'default'); add some first" in capsys.readouterr().err
    assert main(base) != 0
    err = capsys.readouterr().err
    assert "--ref: no reference to compare with: give reference ids (--ref), or recall them with --top-k" in err, err
    assert "top_k" not in err and loads == []


def test_generated_text_is_printed_with_control_characters_escaped():
    from refsight.cli.judging import _generated_text

    data = {"text": "ok\x1b[2J\rmore\nline", "references_cached": [], "model": "m", "random_weights": True,
            "prompt_tokens": 1, "cached_tokens": 0, "prefix_tokens_reused": 0, "tokens": [1],
            "finish_reason": "length", "timings_ms": {}}
    shown = _generated_text(data, [], None)
    assert "\x1b" not in shown and "\r" not in shown and "\\x1b[2J\\x0dmore\nline" in shown
