"""Commands from plugins: found through the entry point group memstream.commands (the bot's `memstream bot`
among them), run with the common options, and a plugin that fails to load or is missing is a clear message."""

from __future__ import annotations

import argparse
from importlib.metadata import EntryPoint

import pytest

from memstream.cli import main
from memstream.cli.parser import build_parser
from memstream.cli.plugins import GROUP, installed
from memstream.exits import EXIT_BAD_INPUT


def _plugin(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=GROUP)


HELLO = _plugin("hello", "tests.memstream.cli.plugin_example:register")


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_the_bot_is_an_installed_plugin_and_memstream_bot_comes_from_it() -> None:
    assert [(p.name, p.value) for p in installed()] == [("bot", "bot.plugin:register")]
    bot = _commands(build_parser())["bot"]
    options = {o for action in bot._actions for o in action.option_strings}
    assert {"--persona", "--db", "-v", "--shard-count", "--shards"} <= options
    assert "bot" not in _commands(build_parser(plugins=[]))  # only the entry point adds it


def test_a_plugin_command_runs_with_the_common_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-v", "hello", "--name", "Ada", "--persona", "p.toml"], plugins=[HELLO]) == 0
    assert capsys.readouterr().out == "hello Ada from p.toml (verbose)\n"
    assert main(["hello", "--name", "nobody"], plugins=[HELLO]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "memstream: error: nobody is not a name\n"


def test_local_is_refused_for_a_plugin_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hello", "--local"], plugins=[HELLO]) == EXIT_BAD_INPUT
    assert "--local is for trying the pipeline from the terminal, not for hello" in capsys.readouterr().err


@pytest.mark.parametrize(("value", "problem"), [
    ("tests.memstream.cli.no_such_module:register", "ModuleNotFoundError: No module named "
                                                    "'tests.memstream.cli.no_such_module'"),
    ("tests.memstream.cli.plugin_example:no_such_function", "AttributeError"),
    ("tests.memstream.cli.plugin_example:register_fails", "RuntimeError: this plugin is broken"),
])
def test_a_broken_plugin_leaves_a_command_that_says_why(value: str, problem: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    broken = _plugin("broken", value)
    assert main(["broken", "--any", "thing"], plugins=[broken, HELLO]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(f"memstream: error: memstream broken comes from the plugin {value}, which failed to "
                          "load: ") and problem in err
    assert err.count("\n") == 1
    assert main(["hello"], plugins=[broken, HELLO]) == 0  # the other commands are unharmed
    assert "hello you" in capsys.readouterr().out


def test_a_plugin_cannot_take_a_command_of_memstream_s(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser(plugins=[_plugin("chat", "tests.memstream.cli.plugin_example:register_chat")])
    assert _commands(parser)["chat"].description == "Talk to the persona: each line you type is observed and answered."
    assert "warning: memstream chat comes from the plugin" in capsys.readouterr().err


def test_without_plugins_an_unknown_command_says_where_they_come_from(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["bot", "--shard-count", "4"], plugins=[])
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bot'" in err and f"no plugin is installed (the entry point group {GROUP})" in err
    assert "pip install -e ." in err
    with pytest.raises(SystemExit):
        main(["chta"], plugins=[HELLO])  # plugins are installed: a typo is only a typo
    assert "no plugin is installed" not in capsys.readouterr().err


def test_unknown_options_are_still_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["hello", "--nonsense"], plugins=[HELLO])
    assert usage.value.code == 2
    assert "memstream: error: unrecognized arguments: --nonsense" in capsys.readouterr().err
