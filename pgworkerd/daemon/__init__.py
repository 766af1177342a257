"""The daemon's parent process, as components."""
