//! The runner's latencies, one session at a time on a quiet hub: a tool step's cost (the
//! scripted model's answer to step n written → its request for step n+1 received) and a
//! wake's (the signal's 202 → the woken turn's request). The model server runs in this
//! process, so its timestamps and the bench's share one clock.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use serde_json::{Value, json};

use crate::bench_kit::hub::Hub;
use crate::bench_kit::procs::poll_every;
use crate::bench_kit::{agent, request_on};

/// Bound on one run's end.
const RUN_LIMIT: Duration = Duration::from_secs(30);
/// How often the bench looks for a request or a run's end; the times themselves come
/// from the model server's clock, so this only bounds the bench's own idle CPU.
const POLL: Duration = Duration::from_micros(500);

/// The model for the step part: `wait_check` with `{}` until the run has `steps` tool
/// answers since its user turn, then a text answer ("done").
pub fn set_step_model(model: &ScriptedModel, steps: usize) {
    model.set_default(Reply::from_fn(move |req| {
        let messages = req["messages"].as_array().cloned().unwrap_or_default();
        let since_user = messages
            .iter()
            .rev()
            .take_while(|m| m["role"] != "user")
            .filter(|m| m["role"] == "tool")
            .count();
        if since_user < steps {
            Reply::tool_call("wait_check", "{}")
        } else {
            Reply::text("done")
        }
    }));
}

/// `runs` runs, each in a fresh session: a message, `steps` tool steps, an answer. Returns
/// every gap (µs) between an answer written and the next request's arrival.
pub fn step_costs(
    hub: &Hub,
    model: &ScriptedModel,
    steps: usize,
    runs: usize,
) -> anyhow::Result<Vec<f64>> {
    let client = agent();
    let mut gaps = Vec::with_capacity(runs * steps);
    // The run's bounds leave room for every step (the same call with the same answer
    // would otherwise end it after three).
    let bound = u32::try_from(steps + 2).context("steps")?;
    for _ in 0..runs {
        let s = hub.api_on(
            &client,
            "POST",
            "/api/sessions",
            Some(json!({"title": "bench step", "stop": {"steps": bound, "repeatedCalls": bound}})),
            201,
        )?;
        let sid = id(&s, "session")?;
        let base = model.request_count();
        let r = hub.api_reply_on(
            &client,
            "POST",
            &format!("/api/sessions/{sid}/messages"),
            Some(json!({"text": "check your waitpoints"})),
        )?;
        ensure!(
            matches!(r.status, 200 | 201),
            "posting a message: HTTP {}: {}",
            r.status,
            r.text()
        );
        let result = run_result(hub, &client, &sid)?;
        ensure!(
            result["result"]["output"]["response"] == "done",
            "session {sid}'s run ended otherwise: {result}"
        );
        let count = model.request_count();
        ensure!(
            count == base + steps + 1,
            "session {sid}: {} model requests, wanted {} steps and an answer",
            count - base,
            steps
        );
        let timings = model.timings();
        for j in base..base + steps {
            let answered = timings[j]
                .answered
                .with_context(|| format!("model answer {j} not written whole"))?;
            let next = timings[j + 1].arrived;
            gaps.push(signed_us(answered, next));
        }
    }
    Ok(gaps)
}

/// One wake, in µs: from the signal's 202 (read whole by the client) and from the POST's
/// start, to the woken turn's request at the model.
pub struct Wake {
    pub after_202_us: f64,
    pub after_post_us: f64,
}

/// `runs` wakes, each in a fresh session with one waitpoint armed through the API.
pub fn wake_latencies(hub: &Hub, model: &ScriptedModel, runs: usize) -> anyhow::Result<Vec<Wake>> {
    let client = agent();
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs {
        let Session { sid, wp, secret } = Session::create(hub, &client, "bench wake")?;
        let body =
            json!({"id": wp, "secret": secret, "status": "ok", "message": "done"}).to_string();
        let base = model.request_count();
        // The arm's write is behind us; nothing else runs on the hub.
        std::thread::sleep(Duration::from_millis(2));
        let posted = Instant::now();
        let r = request_on(
            &client,
            hub.addr,
            "POST",
            "/webhook/signal",
            None,
            Some(body.as_bytes()),
        )?;
        let accepted = Instant::now();
        ensure!(r.status == 202, "signal: HTTP {}: {}", r.status, r.text());
        poll_every(POLL, RUN_LIMIT, "the woken turn's model request", || {
            Ok((model.request_count() > base).then_some(()))
        })?;
        let arrived = model.timings()[base].arrived;
        let req = model.request(base).context("the woken turn's request")?;
        let last = req["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or(Value::Null);
        ensure!(
            last["role"] == "user" && last["content"].as_str().is_some_and(|t| t.contains(&wp)),
            "the request after the signal is not the wake of {wp}: its last message is {last}"
        );
        run_result(hub, &client, &sid)?;
        out.push(Wake {
            after_202_us: signed_us(accepted, arrived),
            after_post_us: signed_us(posted, arrived),
        });
    }
    Ok(out)
}

/// Waits for the session's run to end; its `GET …/result`.
pub fn run_result(hub: &Hub, client: &ureq::Agent, sid: &str) -> anyhow::Result<Value> {
    let path = format!("/api/sessions/{sid}/result");
    poll_every(POLL, RUN_LIMIT, &format!("session {sid}'s run-end"), || {
        let r = hub.api_reply_on(client, "GET", &path, None)?;
        match r.status {
            200 => Ok(Some(r.json(&path)?)),
            404 => Ok(None),
            s => anyhow::bail!("GET {path}: HTTP {s}: {}", r.text()),
        }
    })
}

/// The `id` of a created session or waitpoint.
/// A session with one armed waitpoint.
pub struct Session {
    pub sid: String,
    pub wp: String,
    pub secret: String,
}

impl Session {
    /// Creates one through the API (`client`'s kept-alive connection).
    pub fn create(hub: &Hub, client: &ureq::Agent, title: &str) -> anyhow::Result<Session> {
        let s = hub.api_on(
            client,
            "POST",
            "/api/sessions",
            // An agent session: without a runner setting a session is a mailbox, and no
            // wake of it would reach the model.
            Some(json!({ "title": title, "runs": true })),
            201,
        )?;
        let sid = id(&s, "session")?;
        let w = hub.api_on(
            client,
            "POST",
            &format!("/api/sessions/{sid}/waitpoints"),
            Some(json!({"label": "bench", "intent": "bench"})),
            201,
        )?;
        Ok(Session {
            sid,
            wp: id(&w, "waitpoint")?,
            secret: w["secret"]
                .as_str()
                .context("a waitpoint without secret")?
                .to_string(),
        })
    }
}

fn id(v: &Value, what: &str) -> anyhow::Result<String> {
    Ok(v["id"]
        .as_str()
        .with_context(|| format!("a new {what} without id: {v}"))?
        .to_string())
}

/// `to - from` in µs, negative when `to` came first.
fn signed_us(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_secs_f64() * 1e6,
        None => -(from.duration_since(to).as_secs_f64() * 1e6),
    }
}
