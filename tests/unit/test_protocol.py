"""Unit tier: the parent<->child protocol and its frames: every message survives the
trip, what is not a message is refused with a clear reason, frames split or joined
anywhere decode the same, and exit statuses read as words."""

from __future__ import annotations

import json
import signal

import pytest

from pgworkerd.daemon.supervisor import describe_exit
from pgworkerd.worker import protocol
from pgworkerd.worker.wire import MAX_FRAME, FrameReader, FrameTooLarge

EVERY_MESSAGE: list[protocol.Message] = [
    protocol.Hello(4242),
    protocol.Started(7),
    protocol.Beat(),
    protocol.Beat(progress={"done": 3}, checkpoint=[1, 2]),
    protocol.Done(7, {"ok": True}),
    protocol.Done(7),
    protocol.Failed(7, "ValueError: bad", "Traceback ..."),
    protocol.Interrupted(7, "stopped by the daemon (SIGTERM)"),
    protocol.Job(7, "h", "m:f", "default", {"x": 1}, 1, 5, None, 1234.5),
    protocol.LeaseExtended(1300.25),
    protocol.Cancel(),
    protocol.Shutdown(),
    protocol.Shutdown(7),
    protocol.Exit(),
    protocol.Watch(7, 1, 1234.5),
    protocol.Watch(7, 2, 1234.5, 1 << 30, 8),
]


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_every_message_survives_encode_and_decode(message: protocol.Message) -> None:
    [frame] = FrameReader().feed(protocol.encode(message))
    assert frame["t"] == message.kind.value
    assert protocol.decode(frame) == message


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ([1, 2], "must be a JSON object"),
        ({"t": "bogus"}, "unknown message kind 'bogus'"),
        ({"pid": 1}, "unknown message kind"),
        ({"t": "hello"}, "hello message without 'pid'"),
        ({"t": "hello", "pid": "12"}, "'pid' is str, not int"),
        ({"t": "done", "id": True}, "'id' is bool, not int"),
        ({"t": "error", "id": 1, "error": None}, "'error' is NoneType, not str"),
        ({"t": "lease", "deadline": "soon"}, "'deadline' is str, not float"),
    ],
)
def test_what_is_not_a_message_is_refused_with_the_reason(frame: object, reason: str) -> None:
    with pytest.raises(protocol.ProtocolError, match=reason):
        protocol.decode(frame)


def test_optional_fields_may_be_left_out() -> None:
    assert protocol.decode({"t": "beat"}) == protocol.Beat()
    assert protocol.decode({"t": "error", "id": 3, "error": "x"}) == protocol.Failed(3, "x", "")
    assert protocol.decode({"t": "lease", "deadline": 5}) == protocol.LeaseExtended(5)


def test_frames_split_or_joined_anywhere_decode_the_same() -> None:
    stream = b"".join(protocol.encode(m) for m in EVERY_MESSAGE)
    for size in (1, 3, 7, 64, len(stream)):
        reader = FrameReader()
        frames = []
        for start in range(0, len(stream), size):
            frames += reader.feed(stream[start : start + size])
        assert [protocol.decode(f) for f in frames] == EVERY_MESSAGE


def test_a_frame_over_the_limit_is_refused_on_both_sides() -> None:
    with pytest.raises(FrameTooLarge, match="over the 64 MiB limit"):
        protocol.encode(protocol.Done(1, "x" * MAX_FRAME))
    announced = (MAX_FRAME + 1).to_bytes(4, "big")
    with pytest.raises(FrameTooLarge, match="peer announced a frame"):
        FrameReader().feed(announced + b"{}")


def test_values_json_cannot_carry_are_refused_at_encoding() -> None:
    with pytest.raises(ValueError):
        protocol.encode(protocol.Done(1, float("nan")))
    with pytest.raises(TypeError):
        protocol.encode(protocol.Done(1, {1, 2}))


# What release 0.2 sent for each kind (its parent and children built these dicts by
# hand). During an upgrade a fork server restarted from the new package serves the old
# parent, so the new frames must read the same to it: the same keys, a key only with a
# value, plus the job `id` on beat, lease and cancel, which release 0.2 ignores.
AS_RELEASE_0_2 = [
    (protocol.Hello(4242), {"t": "hello", "pid": 4242}),
    (protocol.Started(7), {"t": "started", "id": 7}),
    (protocol.Beat(7), {"t": "beat", "id": 7}),
    (protocol.Beat(7, progress={"n": 1}), {"t": "beat", "id": 7, "progress": {"n": 1}}),
    (protocol.Beat(7, checkpoint=[1]), {"t": "beat", "id": 7, "checkpoint": [1]}),
    (protocol.Done(7, {"ok": 1}), {"t": "done", "id": 7, "result": {"ok": 1}}),
    (protocol.Done(7), {"t": "done", "id": 7}),
    (protocol.Failed(7, "e", "tb"), {"t": "error", "id": 7, "error": "e", "traceback": "tb"}),
    (protocol.Failed(7, "e"), {"t": "error", "id": 7, "error": "e", "traceback": ""}),
    (
        protocol.Interrupted(7, "e", "tb"),
        {"t": "interrupted", "id": 7, "error": "e", "traceback": "tb"},
    ),
    (
        protocol.Job(7, "h", "m:f", "q", {"x": 1}, 2, 5, None, 12.5),
        {
            "t": "job",
            "id": 7,
            "handler": "h",
            "target": "m:f",
            "queue": "q",
            "payload": {"x": 1},
            "attempt": 2,
            "max_attempts": 5,
            "checkpoint": None,  # always there: release 0.2's child reads job["checkpoint"]
            "deadline": 12.5,
        },
    ),
    (protocol.LeaseExtended(99.5, 7), {"t": "lease", "deadline": 99.5, "id": 7}),
    (protocol.Cancel(7), {"t": "cancel", "id": 7}),
    (protocol.Shutdown(), {"t": "shutdown"}),
    (protocol.Exit(), {"t": "exit"}),
]


@pytest.mark.parametrize(("message", "sent"), AS_RELEASE_0_2, ids=lambda v: str(v)[:30])
def test_frames_read_as_release_0_2s_did(message: protocol.Message, sent: dict) -> None:
    assert json.loads(protocol.encode(message)[4:]) == sent
    assert protocol.decode(sent) == message


# A handler's chosen outcome rides on the failure message as optional fields: a frame
# with none of them is exactly release 0.2's (above), and one with them still carries
# what release 0.2 reads, "error" and "traceback" (it ignores keys it does not know),
# so an old parent records an ordinary failed attempt.
CHOSEN_OUTCOMES = [
    (protocol.Failed(7, "Snooze: run again in 600s", "tb", snooze=600.0), {"snooze": 600.0}),
    (protocol.Failed(7, "GiveUp: gone", "tb", give_up="gone"), {"give_up": "gone"}),
    (
        protocol.Failed(7, "ValueError: x", "tb", exception_types=["ValueError", "Exception"]),
        {"exception_types": ["ValueError", "Exception"]},
    ),
]


@pytest.mark.parametrize(("message", "extra"), CHOSEN_OUTCOMES, ids=lambda v: str(v)[:40])
def test_chosen_outcomes_are_a_failure_to_release_0_2(
    message: protocol.Failed, extra: dict
) -> None:
    sent = json.loads(protocol.encode(message)[4:])
    as_0_2 = {"t": "error", "id": 7, "error": message.error, "traceback": "tb"}
    assert sent == {**as_0_2, **extra}
    assert protocol.decode(sent) == message
    # what release 0.2's parent reads of it (pgworkerd-0.2.0 daemon/outcomes.py)
    assert (sent["t"], sent["error"], sent["traceback"]) == ("error", message.error, "tb")


@pytest.mark.parametrize(
    "bad",
    [
        {"snooze": "600"},
        {"snooze": True},
        {"give_up": 3},
        {"exception_types": "ValueError"},
        {"exception_types": [1]},
        {"exception_types": ["x" * 513]},
        {"exception_types": ["E"] * 65},
    ],
)
def test_chosen_outcome_fields_of_the_wrong_shape_are_refused(bad: dict) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.decode({"t": "error", "id": 7, "error": "e", **bad})


def test_messages_of_release_0_2_without_a_job_id_still_decode() -> None:
    assert protocol.decode({"t": "beat", "progress": 1}) == protocol.Beat(None, progress=1)
    assert protocol.decode({"t": "lease", "deadline": 5.0}) == protocol.LeaseExtended(5.0)
    assert protocol.decode({"t": "cancel"}) == protocol.Cancel()


def test_describe_exit_reads_statuses_as_words() -> None:
    # raw wait statuses, as os.waitpid returns them
    assert describe_exit(3 << 8) == "exited with code 3"
    assert describe_exit(signal.SIGKILL) == "killed by SIGKILL (the OOM killer or kill -9)"
    assert describe_exit(signal.SIGSEGV) == "killed by SIGSEGV (segmentation fault)"
    assert describe_exit(signal.SIGTERM) == "killed by SIGTERM"
    assert describe_exit(77) == "killed by signal 77"
    # a child that stopped itself when its lease ran out (pgworkerd.worker.reaper)
    assert describe_exit(117 << 8).startswith("stopped itself: its lease ran out without renewal")
