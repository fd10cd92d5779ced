"""Text that others wrote (a job's output, an engine's progress lines) made safe to show on this terminal: the
escape sequences a terminal acts on, and the other control characters, left out.

A job's line reaches the user's terminal through ``nodekit top``, ``nodekit logs`` and Compose's streamed output.
Terminals act on more than colours: OSC 8 makes a hyperlink whose text hides its target, OSC 52 writes the
clipboard, and DCS/APC strings reach terminal-specific handlers. Each has a 7-bit form (ESC and a letter) and an
8-bit one (a C1 character, U+0080..U+009F), and a string sequence ends at BEL or ST (ESC backslash, or U+009C).
"""

from __future__ import annotations

import re

ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI: cursor, erase, SGR colours (ESC [ or its 8-bit form)
    r"|(?:\x1b[]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]?"  # the other escape sequences (ESC and one final byte, with intermediates), or a lone ESC
)
"""Every escape sequence (ECMA-48), 7- and 8-bit; an unterminated string sequence runs to the end of the text."""

_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` as one line shown as written: a carriage-return redraw's last state, escape sequences
    (:data:`ESCAPES`) and every other C0/C1 control character left out, a tab as a space."""
    last = text.rstrip("\r\n").rsplit("\r", 1)[-1]
    return _CONTROLS.sub("", ESCAPES.sub("", last)).replace("\t", " ")
