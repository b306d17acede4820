//! What the crash torture (`torture.rs`) and the power-loss torture (`powerloss.rs`)
//! share: the run's parameters from the environment and its replayable randomness, the
//! kinds of waitpoint they load, a client's POST of one keyed signal re-sent until the
//! hub answers, and a waitpoint's view reduced to what their checks compare.

use std::sync::RwLock;
use std::time::{Duration, Instant};

use cortex_cli::http::{Method, Request};
use cortex_tests::Hub;
use serde_json::{Value, json};

/// How long a client keeps re-sending one body while the hub is down or restarting.
pub const RETRY_LIMIT: Duration = Duration::from_secs(60);

/// A count from the environment variable `name` (at least 1), `default` without it.
pub fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} is a number, not {v:?}"))
        })
        .unwrap_or(default)
        .max(1)
}

/// The run's seed from the environment variable `name`, or from the clock; the caller
/// prints it, so a run can be repeated.
pub fn seed_from_env(name: &str) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} is a number, not {v:?}"))
        })
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

/// splitmix64: enough randomness for choosing, replayable from a printed seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    OneShot,
    Barrier,
    Monitor,
}

/// What a client's signal came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    InFlight,
    Accepted,
    /// The first HTTP answer was "duplicate": an earlier attempt was recorded but its
    /// answer was lost to the kill or the cut.
    Duplicate,
    Gone,
    Other(u16, String),
    Unanswered,
}

impl Outcome {
    /// Answered 202: the hub promised to keep it.
    pub fn acked(&self) -> bool {
        matches!(self, Outcome::Accepted | Outcome::Duplicate)
    }
}

/// A keyed signal's body for waitpoint `id`: with `member` when given, and with the key
/// as its message too when `message` (so a wake's text shows which signals it carried).
pub fn keyed_body(
    id: &str,
    secret: &str,
    status: &str,
    member: Option<&str>,
    key: &str,
    message: bool,
) -> Vec<u8> {
    let mut b = json!({"id": id, "secret": secret, "status": status, "key": key});
    if message {
        b["message"] = json!(key);
    }
    if let Some(m) = member {
        b["member"] = json!(m);
    }
    serde_json::to_vec(&b).expect("json")
}

/// Which answers end a client's re-sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Any HTTP answer (the crash torture: a 5xx is an outcome to check).
    Answered,
    /// An answer below 500 (the power-loss torture: a 5xx is the hub starting or cut).
    Below500,
}

/// One body's sending.
#[derive(Debug)]
pub struct Sending {
    pub outcome: Outcome,
    /// Attempts that got no HTTP answer before the last.
    pub unanswered: u32,
    /// Attempts sent again: unanswered ones, and 5xx ones under [`Until::Below500`].
    pub retried: u32,
}

/// POSTs `body` to the signal route of the hub at `addr` (re-read on each attempt, as
/// restarts move it) until `until` says an answer is final, at most [`RETRY_LIMIT`].
pub fn send(addr: &RwLock<String>, body: &[u8], until: Until) -> Sending {
    let start = Instant::now();
    let (mut unanswered, mut retried) = (0, 0);
    loop {
        let url = format!(
            "http://{}/webhook/signal",
            addr.read().unwrap_or_else(|e| e.into_inner())
        );
        let r = Request::new(Method::Post, &url)
            .json(body)
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(30))
            .send();
        match r {
            Ok(resp) => {
                let v: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
                let outcome = match (resp.status, v["result"].as_str()) {
                    (202, Some("accepted")) => Some(Outcome::Accepted),
                    (202, Some("duplicate")) => Some(Outcome::Duplicate),
                    (410, _) => Some(Outcome::Gone),
                    (st, _) if st < 500 || until == Until::Answered => {
                        Some(Outcome::Other(st, resp.text().to_string()))
                    }
                    _ => None,
                };
                if let Some(outcome) = outcome {
                    return Sending {
                        outcome,
                        unanswered,
                        retried,
                    };
                }
            }
            Err(_) => unanswered += 1,
        }
        retried += 1;
        if start.elapsed() > RETRY_LIMIT {
            return Sending {
                outcome: Outcome::Unanswered,
                unanswered,
                retried,
            };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A recorded signal, as far as the checks need it.
#[derive(Debug, PartialEq)]
pub struct Sig {
    pub key: String,
    pub status: String,
    pub member: Option<String>,
    pub at: u64,
}

/// A waitpoint's view, reduced to what the checks compare.
pub struct View {
    pub state: String,
    pub signal_count: u64,
    /// In seq order.
    pub signals: Vec<Sig>,
    pub wakes: usize,
    pub undelivered: usize,
}

pub fn view(hub: &Hub, id: &str) -> View {
    let v = hub.get_waitpoint(id);
    let wakes = v["wakes"].as_array().cloned().unwrap_or_default();
    View {
        state: v["state"].as_str().unwrap_or("").to_string(),
        signal_count: v["signal_count"].as_u64().expect("signal_count"),
        signals: v["signals"]
            .as_array()
            .expect("signals")
            .iter()
            .map(|s| Sig {
                key: s["key"].as_str().unwrap_or("").to_string(),
                status: s["status"].as_str().unwrap_or("").to_string(),
                member: s["member"].as_str().map(str::to_string),
                at: s["at"].as_u64().unwrap_or(0),
            })
            .collect(),
        wakes: wakes.len(),
        undelivered: wakes.iter().filter(|w| w["delivered"] != true).count(),
    }
}
