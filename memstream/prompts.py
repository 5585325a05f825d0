"""The spec's four prompts, loaded by name from prompts/*.md and rendered strictly."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from memstream.errors import MissingVariables, PromptError

__all__ = ["PROMPT_NAMES", "Prompt", "load_prompt", "one_line", "tag_safe"]

PROMPT_NAMES = ("importance", "reflection_questions", "reflection_insights", "agent")
_VARIABLE = re.compile(r"\{\{(\w+)\}\}")
# A tag the prompts wrap untrusted text in, opening or closing, with any spacing or attributes, written with
# ASCII or look-alike brackets and slashes (after NFKC folding, which turns fullwidth and small forms to ASCII).
_OPEN, _CLOSE, _SLASH = "<\u2039\u2329\u3008\u27e8", ">\u203a\u232a\u3009\u27e9", "/\u2044\u2215\u29f8\\\\"
_TAG = re.compile(rf"[{_OPEN}]\s*([{_SLASH}]?)\s*(memory|memories|statements)\b[^{_CLOSE}]*[{_CLOSE}]",
                  re.IGNORECASE)
# Invisible format characters (zero-width spaces and joiners, bidi marks, soft hyphens, BOM) that would let
# "<\u200b/memory>" pass for a closing tag: they are dropped from untrusted text.
_INVISIBLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u202a-\u202e"
                        "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Prompt:
    """A prompt template with {{variables}}."""

    name: str
    template: str

    @property
    def variables(self) -> frozenset[str]:
        """The names this prompt needs."""
        return frozenset(_VARIABLE.findall(self.template))

    def render(self, **values: str) -> str:
        """Fill every {{variable}} in one pass; values are never re-scanned for variables."""
        missing = sorted(self.variables - values.keys())
        if missing:
            raise MissingVariables(self.name, missing)
        unknown = sorted(values.keys() - self.variables)
        if unknown:
            raise PromptError(f"prompt {self.name!r} has no variable {', '.join(unknown)}")
        return _VARIABLE.sub(lambda match: values[match.group(1)], self.template)


def _prompt_dirs() -> list[Path]:
    here = Path(__file__).resolve().parent
    # The source tree's prompts/, then the copy shipped inside the wheel.
    return [d for d in (here.parent / "prompts", here / "prompt_templates") if d.is_dir()]


@cache
def load_prompt(name: str) -> Prompt:
    """Load prompts/NAME.md (from the source tree, or the copy shipped in the wheel)."""
    if name not in PROMPT_NAMES:
        raise PromptError(f"unknown prompt {name!r}; known: {', '.join(PROMPT_NAMES)}")
    for directory in _prompt_dirs():
        path = directory / f"{name}.md"
        if path.is_file():
            return Prompt(name, path.read_text(encoding="utf-8"))
    raise PromptError(f"prompt file {name}.md not found (is the package installed with its data?)")


def tag_safe(text: str) -> str:
    """Text that cannot open or close the tags our prompts wrap untrusted text in, by the one rule every
    untrusted text (messages, memories, names and the models' own output) gets before it enters a prompt:
    invisible characters dropped, look-alike characters folded (NFKC), any such tag written as &lt;...&gt;."""
    folded = unicodedata.normalize("NFKC", _INVISIBLE.sub("", text))
    return _TAG.sub(lambda m: f"&lt;{'/' if m.group(1) else ''}{m.group(2)}&gt;", folded)


def one_line(text: str) -> str:
    """Untrusted text as a single line: control characters dropped, runs of white space folded.

    A memory rendered in a list must not start a line of its own, or it could pose as another
    numbered statement.
    """
    return " ".join(_CONTROL.sub(" ", text).split())
