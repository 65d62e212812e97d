#!/usr/bin/env python3
"""Drives trybox's own REST routes (docs/protocol/rest.md) with Python's `requests`, as a
program of a user's would: runs an agent and follows its server-sent events, lists and shows
runs, answers a run that asked a question (an approval), reads the audit and the VMs, and
tries what must be refused. tests/e2e/rest_e2e_test.cc runs it against a private tryboxd and
a scripted fake model, and checks what it prints: one JSON object of what it saw.

Environment: TRYBOX_URL, TRYBOX_KEY (an operator key), TRYBOX_SANDBOX_KEY (a sandboxes key),
MODEL_BASE_URL, MODEL_NAME.
"""
import json
import os
import sys

import requests

URL = os.environ["TRYBOX_URL"].rstrip("/") + "/trybox/v1"
KEY = os.environ["TRYBOX_KEY"]
MODEL = {
    "provider": "openai",
    "base_url": os.environ["MODEL_BASE_URL"],
    "api_key": "sk-rest-test-not-a-real-key",
    "model": os.environ["MODEL_NAME"],
}
TIMEOUT = 600


def headers(key=KEY):
    return {"X-API-KEY": key}


def events(response):
    """Yields (event, data) from a text/event-stream response as it arrives."""
    name, data = None, []
    for line in response.iter_lines(decode_unicode=True):
        if line is None:
            continue
        if line == "":
            if name is not None or data:
                yield name or "message", json.loads("\n".join(data)) if data else None
            name, data = None, []
        elif line.startswith(":"):
            continue  # a keepalive comment
        elif line.startswith("event:"):
            name = line[len("event:"):].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:"):].strip())


def stream(method, path, body):
    """A streaming route's events, in order, as [name, data]."""
    with requests.request(method, URL + path, json=body, headers=headers(), stream=True,
                          timeout=TIMEOUT) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "body": r.json()}
        assert r.headers["Content-Type"].startswith("text/event-stream"), r.headers
        return [[n, d] for n, d in events(r)]


def call(method, path, key=KEY, **kwargs):
    r = requests.request(method, URL + path, headers=headers(key), timeout=TIMEOUT, **kwargs)
    try:
        body = r.json()
    except ValueError:
        body = r.text
    return {"status": r.status_code, "body": body}


def last(evs, name):
    found = [d for n, d in evs if n == name]
    return found[-1] if found else None


out = {}

# A run from start to its report, followed as it goes.
evs = stream("POST", "/agent-runs", {"task": "write a greeting", "image": "debian-12",
                                     "model": MODEL})
out["run_events"] = [n for n, _ in evs] if isinstance(evs, list) else evs
end = last(evs, "end") if isinstance(evs, list) else None
report = end["report"] if end else {}
run = report.get("run")
out["run"] = {"id": run, "outcome": report.get("outcome"), "verdict": report.get("verdict"),
              "first_event": evs[0] if isinstance(evs, list) and evs else None,
              "text_has_verdict": "Verdict:" in (end or {}).get("text", "")}

shown = call("GET", f"/agent-runs/{run}")
out["show"] = {"status": shown["status"],
               "outcome": shown["body"].get("report", {}).get("outcome")}
listed = call("GET", "/agent-runs", params={"limit": 10})
out["listed"] = [r["run"] for r in listed["body"].get("runs", [])]
follow = stream("GET", f"/agent-runs/{run}/events", None)
out["follow_ended"] = [n for n, _ in follow][-1:] if isinstance(follow, list) else follow

# A run that asks: it waits as an approval until it is answered.
evs = stream("POST", "/agent-runs", {"task": "greet someone", "image": "debian-12",
                                     "model": MODEL})
asked = (last(evs, "end") or {}).get("report", {}) if isinstance(evs, list) else {}
out["asked"] = {"outcome": asked.get("outcome"), "question": asked.get("question")}
waiting = call("GET", "/approvals")["body"].get("approvals", [])
out["approvals"] = [{"run": a["run"], "question": a["question"], "kind": a["kind"]}
                    for a in waiting]
answered = stream("POST", f"/agent-runs/{asked.get('run')}/answer", {"answer": "say bonjour"})
done = (last(answered, "end") or {}).get("report", {}) if isinstance(answered, list) else {}
out["answered"] = {"outcome": done.get("outcome"), "verdict": done.get("verdict")}
out["approvals_after"] = call("GET", "/approvals")["body"].get("approvals")

# A running VM's list, changed over HTTP.
VM = os.environ["TRYBOX_VM"]
out["egress"] = call("POST", f"/vms/{VM}/egress", json={"allow": ["b.test:8080"], "deny": ["c.test"]})

# The record, and the VMs.
audit = call("GET", "/audit", params={"limit": 5})
out["audit"] = {"status": audit["status"], "has_rows": isinstance(audit["body"].get("egress"), list)}
vms = call("GET", "/vms")
out["vms"] = {"status": vms["status"], "is_list": isinstance(vms["body"].get("vms"), list)}

# What is refused, each with its own error.
def refused(r):
    body = r["body"] if isinstance(r["body"], dict) else {}
    return {"status": r["status"], "message": body.get("message", ""),
            "code": body.get("status", "")}

out["refused"] = {
    "unknown_run": refused(call("GET", "/agent-runs/r0000000000")),
    "bad_run_id": refused(call("GET", "/agent-runs/bad%20id")),
    "bad_json": refused(call("POST", "/agent-runs", data="{not json")),
    "no_task": refused(call("POST", "/agent-runs", json={"model": MODEL})),
    "cancel_done": refused(call("POST", f"/agent-runs/{run}/cancel")),
    "collect_into": refused(call("POST", "/vms/abc/collect", json={"into": "/tmp/x"})),
    "egress_field": refused(call("POST", f"/vms/{VM}/egress", json={"mode": "internet"})),
    "egress_entry": refused(call("POST", f"/vms/{VM}/egress", json={"allow": ["10.0.0.1"]})),
    "egress_no_vm": refused(call("POST", "/vms/nosuchvm/egress", json={"deny": ["x.test"]})),
    "bad_limit": refused(call("GET", "/audit", params={"limit": "lots"})),
    "sandbox_key": refused(call("GET", "/vms", key=os.environ["TRYBOX_SANDBOX_KEY"])),
    # Another spelling of the same route is judged the same way.
    "sandbox_key_slashes": refused(
        {"status": (r := requests.get(os.environ["TRYBOX_URL"].rstrip("/") + "//trybox//v1/vms",
                                      headers=headers(os.environ["TRYBOX_SANDBOX_KEY"]),
                                      timeout=TIMEOUT)).status_code,
         "body": r.json()}),
    "no_key": refused({"status": requests.get(URL + "/vms", timeout=TIMEOUT).status_code,
                       "body": {}}),
}

json.dump(out, sys.stdout)
print()
