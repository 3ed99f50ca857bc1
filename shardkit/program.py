"""The ``shardkit`` program (``[project.scripts]``): the command, then the process's end."""

from __future__ import annotations

from typing import NoReturn

from .cli import main
from .cli_exit import end


def run() -> NoReturn:
    end(main())
