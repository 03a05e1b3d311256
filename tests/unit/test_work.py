"""Background work (rdmad.core.work): a failed job is logged with what it was doing and whose;
a batch runs a burst of requests as one pass; quiesce waits for every job but those parked
waiting for news."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rdmad.core.logfields import MESSAGE_JOB_FAILED
from rdmad.core.work import Batch, Job, Work

log = logging.getLogger("rdmad.test")


async def test_a_failed_job_is_logged_with_what_it_was_doing_and_whose(
    caplog: pytest.LogCaptureFixture,
) -> None:
    work = Work(log)

    async def broken() -> None:
        raise RuntimeError("bug")

    with caplog.at_level(logging.ERROR, logger="rdmad"):
        work.spawn(broken(), Job("ending claim c1 (netns-gone)", "mlx5_0", "netns:[7]", "c1"))
        await work.quiesce()
    [record] = caplog.records
    assert record.getMessage() == "ending claim c1 (netns-gone) failed: RuntimeError('bug')"
    fields = ("MESSAGE_ID", "RDMAD_DEVICE", "RDMAD_NETNS", "RDMAD_CLAIM")
    assert [record.__dict__[k] for k in fields] == [MESSAGE_JOB_FAILED, "mlx5_0", "netns:[7]", "c1"]
    assert record.exc_info is not None, "the traceback goes with it"


async def test_a_burst_of_requests_is_one_pass_over_their_keys() -> None:
    work, passes = Work(log), []

    async def run(keys: set[str] | None) -> None:
        passes.append(keys)

    batch = Batch[str](work, Job("test"), run)
    batch.add({"a"})
    batch.add({"b"})
    batch.add(set())
    await work.quiesce()
    assert passes == [{"a", "b"}]


async def test_a_request_for_all_covers_the_keys_of_its_burst() -> None:
    work, passes = Work(log), []

    async def run(keys: set[str] | None) -> None:
        passes.append(keys)

    batch = Batch[str](work, Job("test"), run)
    batch.add({"a"})
    batch.add()
    await work.quiesce()
    assert passes == [None]


async def test_requests_made_while_a_pass_runs_make_one_more_pass() -> None:
    work, passes, running, go = Work(log), [], asyncio.Event(), asyncio.Event()

    async def run(keys: set[str] | None) -> None:
        passes.append(keys)
        running.set()
        await go.wait()

    batch = Batch[str](work, Job("test"), run)
    batch.add({"a"})
    await running.wait()
    batch.add({"b"})
    batch.add({"c"})
    go.set()
    await work.quiesce()
    assert passes == [{"a"}, {"b", "c"}]


async def test_a_failed_pass_is_logged_and_the_batch_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    work, passes = Work(log), []

    async def run(keys: set[str] | None) -> None:
        passes.append(keys)
        if keys == {"a"}:
            batch.add({"b"})
            raise RuntimeError("bug")

    batch = Batch[str](work, Job("re-reading things"), run)
    with caplog.at_level(logging.ERROR, logger="rdmad"):
        batch.add({"a"})
        await work.quiesce()
    assert passes == [{"a"}, {"b"}]
    assert [r.getMessage() for r in caplog.records] == [
        "re-reading things failed: RuntimeError('bug')"
    ]


async def test_quiesce_waits_for_the_jobs_that_jobs_spawn() -> None:
    work, done = Work(log), []

    async def inner() -> None:
        await asyncio.sleep(0)
        done.append("inner")

    async def outer() -> None:
        await asyncio.sleep(0)
        work.spawn(inner(), Job("inner"))

    work.spawn(outer(), Job("outer"))
    await work.quiesce()
    assert done == ["inner"]


async def test_quiesce_does_not_wait_for_a_job_parked_until_news_comes() -> None:
    work, news, done = Work(log), asyncio.get_running_loop().create_future(), []

    async def waiting() -> None:
        with work.parked(news.done):
            await news
        await asyncio.sleep(0)
        done.append("woken")

    task = work.spawn(waiting(), Job("waiting"))
    await work.quiesce()
    assert done == [] and not task.done()
    news.set_result(None)
    await work.quiesce()  # the news came: the job is busy again until it is done
    assert done == ["woken"]
    await work.close()


async def test_close_cancels_a_parked_job() -> None:
    work, news = Work(log), asyncio.get_running_loop().create_future()

    async def waiting() -> None:
        with work.parked(news.done):
            await news

    task = work.spawn(waiting(), Job("waiting"))
    await work.quiesce()
    await work.close()
    assert task.cancelled()
