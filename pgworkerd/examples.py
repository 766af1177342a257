"""The path config files name the example handlers by (pgworkerd.examples:echo, ...)."""

from pgworkerd.worker.examples import *  # noqa: F403
