"""py-spy's raw stacks put in categories by their innermost frame that names one."""

from bench.profile_stacks import Profile, category, table

LOOP = "Runner.run (asyncio/runners.py:118);Handle._run (asyncio/events.py:80)"


def test_the_innermost_frame_that_names_a_category_decides() -> None:
    step = f"{LOOP};Resize.process (services/preprocess/steps/images.py:40)"
    assert category(f"{step};resize (PIL/Image.py:2200)") == "work"
    assert category(f"{step};mean (numpy/core/_methods.py:10)") == "work"  # numpy passed over
    decode = f"{LOOP};DataPlane.infer (services/inference/dataplane.py:51)"
    assert category(f"{decode};request_inputs (strata/wire/codec.py:202)") == "(de)serialising"
    assert category(f"{decode};Lane.send (services/gateway/upstream/lanes.py:90)") == "Strata"
    assert category(f"{LOOP};_call (grpc/aio/_call.py:300)") == "gRPC"
    assert category(LOOP) == "loop"
    assert category("Thread.run (threading.py:982)") == "other"


def test_native_waits_are_idle_and_not_counted() -> None:
    raw = "\n".join(
        [
            f"{LOOP};_call (grpc/aio/_call.py:300) 3",
            "Thread.run (threading.py:982);0x7f (grpc/_cython/cygrpc.so);epoll_wait (libc.so.6) 40",
            "Thread.run (threading.py:982);0x7f (grpc/_cython/cygrpc.so);0x7f3 (libc.so.6) 9",
            "Thread.run (threading.py:982);0x7f (grpc/_cython/cygrpc.so);memcpy (libc.so.6) 2",
            "Thread.run (threading.py:982) 1",
        ]
    )
    profile = Profile.of(raw)
    assert profile.counts == {"gRPC": 5, "other": 1}
    lines = table({"gateway": profile})
    assert "| gateway | 6 | 0% | 0% | 83% | 0% | 0% | 17% |" in lines
    assert "- gateway: `Thread.run (threading.py:982)` 1" in lines
