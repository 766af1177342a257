"""Every value a page renders is bounded (the 2026-11-26 audit's N8: a 30 MB payload made
a 90 MB page): the job page shows the first characters of each value with a raw download
that streams the whole value; the text search looks at a bounded part of each row."""

from __future__ import annotations

import hashlib
import http.client
import urllib.parse

from daemon_harness import Db
from dashboard_harness import BROWSER_DEADLINE, Http, RunningDashboard

from pgworkerd.queue import joblogs, views
from pgworkerd.web import filters, pages


def _download(dashboard: RunningDashboard, client: Http, path: str) -> tuple[int, bytes]:
    """A raw download read as it streams (the harness's client reads text)."""
    conn = http.client.HTTPConnection("127.0.0.1", dashboard.port, timeout=BROWSER_DEADLINE)
    try:
        conn.request(
            "GET", path, headers={"Host": f"127.0.0.1:{dashboard.port}", "Cookie": client.cookie}
        )
        response = conn.getresponse()
        assert response.getheader("Content-Disposition", "").startswith("attachment")
        assert response.getheader("Content-Type", "").startswith("text/plain")
        return response.status, response.read()
    finally:
        conn.close()


def test_a_30_mb_payload_makes_a_small_page_and_a_whole_download(
    dashboard: RunningDashboard, db: Db
) -> None:
    [row] = db.rows(
        "INSERT INTO {schema}.jobs (handler, payload, status, attempts, last_error, progress,"
        " finished_at) VALUES ('work', jsonb_build_object('a', repeat('<x>', 10000000)),"
        " 'dead', 1, repeat('e', 3000000), jsonb_build_object('p', repeat('y', 200000)),"
        " now()) RETURNING id"
    )
    job = row["id"]
    client = Http(dashboard.port)
    client.log_in()
    page = client.get(f"/jobs/{job}")
    assert page.status == 200
    print(f"job page with a 30 MB payload: {len(page.body.encode())} bytes")
    assert len(page.body.encode()) < 1_000_000  # three values cut to 64 Ki characters
    for value in ("payload", "progress", "error"):
        assert f'id="{value}-cut"' in page.body, value
    assert f"/jobs/{job}/raw/payload" in page.body and "download raw" in page.body
    assert "&lt;x&gt;" * 1000 in page.body  # the start of the value is shown (escaped)
    live = client.get(f"/live/jobs/{job}", headers={"X-Live": "1"})
    assert live.status == 200 and len(live.body.encode()) < 1_000_000

    status, raw = _download(dashboard, client, f"/jobs/{job}/raw/payload")
    [stored] = db.rows(
        "SELECT length(payload::text) AS chars, md5(payload::text) AS md5"
        " FROM {schema}.jobs WHERE id = %s",
        (job,),
    )
    assert status == 200 and len(raw) == stored["chars"] == 30_000_009
    assert hashlib.md5(raw).hexdigest() == stored["md5"]
    status, raw = _download(dashboard, client, f"/jobs/{job}/raw/last_error")
    assert status == 200 and raw == b"e" * 3_000_000
    # a value the job does not have, or a name that is not a value: 404
    assert client.get(f"/jobs/{job}/raw/result").status == 404
    assert client.get(f"/jobs/{job}/raw/lease_token").status == 404
    # not without a login
    assert Http(dashboard.port).get(f"/jobs/{job}/raw/payload").status == 302


def test_big_logs_are_cut_with_a_download(dashboard: RunningDashboard, db: Db) -> None:
    job = db.enqueue("work", {})
    head, tail = "h" * 200_000 + "\n", "t" * 300_000 + "\n"
    db.rows(
        "INSERT INTO {schema}.job_logs (job_id, lease_token, attempt, worker, head, tail,"
        " total_bytes, omitted_bytes, finished) VALUES (%s, 7, 1, 'w', %s, %s, 600002, 100000,"
        " true)",
        (job, head, tail),
    )
    client = Http(dashboard.port)
    client.log_in()
    page = client.get(f"/jobs/{job}")
    assert page.status == 200 and len(page.body.encode()) < 400_000
    # the link names the attempt's log without its lease token (a capability)
    ref = pages.log_ref(job, 7)
    assert f"/jobs/{job}/logs/{ref}" in page.body and "/logs/7" not in page.body
    status, raw = _download(dashboard, client, f"/jobs/{job}/logs/{ref}")
    assert status == 200
    entry = {"head": head, "tail": tail, "omitted_bytes": 100000}
    assert raw == joblogs.text_of(entry).encode()  # what `pgworkerd logs` prints
    assert client.get(f"/jobs/{job}/logs/{pages.log_ref(job, 8)}").status == 404
    assert client.get(f"/jobs/{job}/logs/7").status == 404  # a token opens nothing


def test_the_text_search_looks_at_a_bounded_start_of_each_row(
    dashboard: RunningDashboard, db: Db
) -> None:
    window = views.TEXT_SEARCH_CHARS
    early = db.enqueue("work", {"a": "x" * 100 + "needle-early"})
    late = db.enqueue("work", {"a": "x" * window + "needle-late"})
    client = Http(dashboard.port)
    client.log_in()

    def found(text: str) -> list[int]:
        body = client.get("/jobs?" + urllib.parse.urlencode({"text": text})).body
        return [n for n in (early, late) if f'href="/jobs/{n}"' in body]

    assert found("needle-early") == [early]
    assert found("needle-late") == []  # past the searched start of its payload


def test_every_rendered_value_is_bounded() -> None:
    big = "z" * (filters.SHOWN_CHARS * 3)
    for render in (filters._text, filters._pretty, filters._multiline):
        shown = render(big)
        assert len(shown) < filters.SHOWN_CHARS + 100 and "more characters not shown" in shown


def test_a_job_page_lists_its_newest_attempts_with_errors_cut(
    dashboard: RunningDashboard, db: Db
) -> None:
    job = db.enqueue("work", {})
    db.rows(
        "INSERT INTO {schema}.attempts (job_id, lease_token, attempt, outcome, error,"
        " finished_at) SELECT %s, n, n, 'released', 'error of ' || n || repeat('!', 100000),"
        " now() - (1000 - n) * interval '1 s' FROM generate_series(1, 150) n",
        (job,),
    )
    client = Http(dashboard.port)
    client.log_in()
    page = client.get(f"/jobs/{job}").body
    attempts = page.split('id="attempts"', 1)[1].split("</table>", 1)[0]
    assert attempts.count("<tr>") == 1 + pages.ATTEMPTS_SHOWN  # the header and 100 rows
    assert "error of 150!" in attempts and "error of 51!" in attempts
    assert "error of 50!" not in attempts  # older than the newest 100
    assert f"the newest {pages.ATTEMPTS_SHOWN} of 150 attempts" in page
    assert f"showing {filters.SHOWN_CHARS} of 100012 characters" in attempts  # attempt 150
    assert len(page.encode()) < 100 * filters.SHOWN_CHARS + 1_000_000
