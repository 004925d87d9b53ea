"""The CLI's help as a reader sees it: a one-line summary per command, no reStructuredText
markup anywhere (commands, options, groups), examples under every command group that name real
commands, and the plain-text rules themselves."""

from __future__ import annotations

import typer

from cli.app import app
from cli.help import EXAMPLES, plain, summary
from cli.reference import config_rows, config_table, help_text
from stages.collect import CollectConfig


def is_group(cmd) -> bool:
    return hasattr(cmd, "commands")  # Typer's click (vendored in Typer 0.29) or click's


def walk(cmd, path: tuple[str, ...] = ()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from walk(sub, (*path, name))


ROOT_CMD = typer.main.get_command(app)
MARKUP = ("``", ":class:", ":func:", ":mod:", ":meth:")


def test_every_command_has_a_one_line_summary_and_plain_help():
    seen = 0
    for path, cmd in walk(ROOT_CMD):
        texts = [cmd.help or "", cmd.short_help or "", cmd.epilog or ""]
        texts += [getattr(p, "help", None) or "" for p in cmd.params]
        for text in texts:
            assert not any(m in text for m in MARKUP), f"webloop {' '.join(path)}: {text!r}"
        if not path or is_group(cmd):
            continue
        seen += 1
        short = cmd.get_short_help_str(limit=200)
        assert short and "\n" not in short and len(short) <= 90, (path, short)
    assert seen >= 35  # every leaf command was looked at (37 today)


def test_every_group_shows_examples_that_name_real_commands():
    groups = {" ".join(p): c for p, c in walk(ROOT_CMD) if is_group(c)}
    assert set(groups) <= set(EXAMPLES), f"groups without examples: {set(groups) - set(EXAMPLES)}"
    for name, examples in EXAMPLES.items():
        assert "Examples:" in (groups[name].epilog or ""), name
        for example in examples:
            words, cmd = example.split()[:3], ROOT_CMD
            for word in words:  # the command path must resolve down to a leaf command
                if not is_group(cmd) or word.startswith("-"):
                    break
                assert word in cmd.commands, f"example {example!r}: no command {word!r}"
                cmd = cmd.commands[word]
            assert not is_group(cmd) or cmd.invoke_without_command, example
    top = help_text([])
    assert "Examples:" in top and "webloop demo" in top


def test_plain_unwraps_paragraphs_and_drops_markup():
    doc = """Run ``webloop sql`` against the
    warehouse; see :class:`warehouse.store.Warehouse` and :func:`stages.collect.run_collect`.

    A template-
    clustered bootstrap."""
    assert plain(doc) == (
        "Run webloop sql against the warehouse; see Warehouse and run_collect().\n\n"
        "A template-clustered bootstrap."
    )
    assert (
        plain("Bind to [::1]. Example::\n\n    webloop x") == "Bind to [::1]. Example:\n\nwebloop x"
    )
    assert summary("The main job. More text.") == "The main job"
    long = (
        "Serve a model over an OpenAI-compatible HTTP API (/v1) until Ctrl-C or SIGTERM "
        "arrives, then stop."
    )
    assert summary(long) == "Serve a model over an OpenAI-compatible HTTP API"


def test_config_rows_cover_every_field_with_flags_and_defaults():
    rows = {r["key"]: r for r in config_rows(CollectConfig)}
    import dataclasses

    assert set(rows) == {f.name for f in dataclasses.fields(CollectConfig)}
    assert rows["max_steps"]["flag"] == "--max-steps" and rows["max_steps"]["default"] == "`30`"
    assert rows["run_name"]["flag"] == "--run"  # the field's own flag
    table = config_table("stages.collect.CollectConfig")
    assert table.count("\n") == len(rows) + 1  # a header, a rule and one line per field
    assert "``" not in table
