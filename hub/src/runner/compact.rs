//! Compaction: when a session's next request nears the model's context, the transcript's
//! older part (after the prefix) is summarized by a model call and the requests from then
//! on carry the prefix (system, instructions, examples, tool guides: never rebuilt), the
//! summary, and the messages after it. The stored transcript stays whole; the session's
//! row keeps the summary and where it ends ([`crate::store::agent::Summary`]).
//!
//! The summary is computed beside the session's steps ([`summarize`]) and comes back as an
//! inbox item (`compaction`), which the boundary takes only if it still matches what it
//! was computed from ([`valid`]: it starts where the summary in force ends, and the digest
//! of those messages and that summary is the same). Pure rules here: when to compact
//! ([`plan`]), where to cut ([`cut`]), what a request carries ([`context`]), what the
//! summary call asks ([`summary_prompt`]) and whether a refusal was for size
//! ([`is_context_refusal`]).

use std::time::Instant;

use cortex_protocol::api::{Compaction, Usage};
use sha2::{Digest, Sha256};

use crate::model::{ChatMessage, Model, ModelError, Role, StepRequest};
use crate::store::agent::Summary;

/// A compaction starts beside the step once the next request (with room for the answer)
/// reaches this share of the context.
pub const COMPACT_AT_PERCENT: u64 = 75;
/// A person's ask keeps at most this share of the messages it could summarize.
pub const KEEP_PERCENT: u64 = 25;
/// Tokens per byte of a request before a server's usage says better (JSON and English
/// run at 3.5 to 4 bytes a token; a third errs towards compacting early).
pub const DEFAULT_TOKENS_PER_BYTE: f64 = 1.0 / 3.0;
/// The longest a message's text is in the summary call's transcript.
const MESSAGE_CHARS: usize = 1_500;

/// What the next request's size calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Far enough from the context.
    Fits,
    /// Near it: compact beside the step; this request still fits.
    Soon,
    /// It would not fit with room for the answer: compact before the call.
    Now,
}

/// The tokens kept for the answer: the session's `maxTokens`, else an eighth of the
/// context, at most a quarter of it.
pub fn reserve(max_tokens: Option<u32>, context: u64) -> u64 {
    max_tokens.map_or(context / 8, u64::from).min(context / 4)
}

/// The tokens a summary may take: an eighth of the context, 64 to 512.
pub fn summary_room(context: u64) -> u64 {
    (context / 8).clamp(64, 512)
}

/// The tokens of messages a compaction keeps as they are: half of what is left below the
/// threshold once the prefix and tools (`fixed`), the answer's `reserve` and the summary
/// are counted, so the next compaction is as far off as the kept part is big. A person's
/// ask (`forced`: the tokens it could summarize) keeps at most a quarter of those.
pub fn keep(context: u64, reserve: u64, fixed: u64, forced: Option<u64>) -> u64 {
    let below = (context * COMPACT_AT_PERCENT / 100)
        .saturating_sub(reserve)
        .saturating_sub(fixed)
        .saturating_sub(summary_room(context));
    let keep = below / 2;
    match forced {
        Some(total) => keep.min(total * KEEP_PERCENT / 100),
        None => keep,
    }
}

/// When to compact, given the next request's estimated tokens.
pub fn plan(estimate: u64, reserve: u64, context: u64) -> Plan {
    let need = estimate.saturating_add(reserve);
    if context == 0 {
        Plan::Fits
    } else if need > context {
        Plan::Now
    } else if need.saturating_mul(100) >= context.saturating_mul(COMPACT_AT_PERCENT) {
        Plan::Soon
    } else {
        Plan::Fits
    }
}

/// Tokens for `bytes` of request at `per_byte`.
pub fn tokens(bytes: usize, per_byte: f64) -> u64 {
    (bytes as f64 * per_byte).ceil() as u64
}

/// A message's size on the wire.
pub fn message_bytes(m: &ChatMessage) -> usize {
    serde_json::to_vec(m).map_or(0, |v| v.len())
}

/// Tokens per byte, learnt from a request of `bytes` the server counted as `prompt`
/// tokens; `None` when the numbers say nothing.
pub fn calibrate(prompt_tokens: u64, bytes: usize) -> Option<f64> {
    (prompt_tokens > 0 && bytes > 0).then(|| prompt_tokens as f64 / bytes as f64)
}

/// Where a compaction cuts a transcript of messages with these `roles` and estimated
/// `sizes`, summarizing from position `from` on: the first position kept. The kept tail
/// is the longest that holds at most `keep` tokens, never starts with a tool's answer
/// (its call would be summarized away) and is never empty (the model must see the last
/// message: when it alone exceeds `keep`, it is kept whole). At least one message is
/// summarized. `None`: nothing to summarize.
pub fn cut(roles: &[Role], sizes: &[u64], from: usize, keep: u64) -> Option<usize> {
    let len = roles.len().min(sizes.len());
    let valid = |i: usize| roles[i] != Role::Tool;
    let mut longest = None;
    let mut tail = 0u64;
    for i in (from.saturating_add(1)..len).rev() {
        tail = tail.saturating_add(sizes[i]);
        if tail > keep {
            break;
        }
        if valid(i) {
            longest = Some(i);
        }
    }
    // A tail too big for `keep`: the shortest one that is whole.
    let shortest = || (from.saturating_add(1)..len).rev().find(|&i| valid(i));
    longest.or_else(shortest)
}

/// The digest of what a summary is computed from: the summary before it and the messages.
pub fn digest(previous: Option<&str>, messages: &[ChatMessage]) -> String {
    let mut h = Sha256::new();
    h.update(previous.unwrap_or_default().as_bytes());
    h.update([0]);
    for m in messages {
        h.update(serde_json::to_vec(m).unwrap_or_default());
        h.update([b'\n']);
    }
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The first line of the summary's message in a request.
pub const SUMMARY_HEAD: &str =
    "[cortex: the conversation before this point, summarized to fit the model's context]";
/// The reply after the summary when the kept messages begin with the person's (so turns
/// still alternate, as some chat templates require).
pub const SUMMARY_ACK: &str = "Understood; I go on from this summary.";

/// What a request carries: the prefix, the summary (if any), then the messages after it.
pub fn context(
    messages: &[ChatMessage],
    prefix_len: u64,
    summary: Option<&Summary>,
) -> Vec<ChatMessage> {
    let Some(s) = summary else {
        return messages.to_vec();
    };
    let at = |n: u64| usize::try_from(n).unwrap_or(usize::MAX).min(messages.len());
    let (prefix, through) = (at(prefix_len), at(s.through).max(at(prefix_len)));
    let mut out = Vec::with_capacity(prefix + 2 + messages.len() - through);
    out.extend_from_slice(&messages[..prefix]);
    out.push(ChatMessage::user(format!("{SUMMARY_HEAD}\n{}", s.text)));
    if messages.get(through).is_some_and(|m| m.role == Role::User) {
        out.push(ChatMessage::assistant(SUMMARY_ACK, Vec::new()));
    }
    out.extend_from_slice(&messages[through..]);
    out
}

/// Whether the summary `c` still fits the session: it starts where the summary in force
/// ends (or after the prefix) and covers messages the transcript holds, computed from the
/// same messages and summary (`stored`: the transcript from `c.from` on).
pub fn valid(
    c: &Compaction,
    prefix_len: u64,
    summary: Option<&Summary>,
    stored: &[ChatMessage],
) -> Result<(), &'static str> {
    if c.error.is_some() || c.summary.trim().is_empty() {
        return Err("it holds no summary");
    }
    let start = summary.map_or(prefix_len, |s| s.through);
    if c.from != start {
        return Err("the transcript was compacted since it was computed");
    }
    let n = usize::try_from(c.through.saturating_sub(c.from)).unwrap_or(usize::MAX);
    if c.through <= c.from || n > stored.len() {
        return Err("its range is not in the transcript");
    }
    if digest(summary.map(|s| s.text.as_str()), &stored[..n]) != c.digest {
        return Err("the messages it summarizes are not the ones it was computed from");
    }
    Ok(())
}

/// The summary call's messages: an instruction, the earlier summary, and the messages as
/// a plain transcript of at most `budget` bytes (each message cut to its first 1,500
/// characters; the oldest left out first).
pub fn summary_prompt(
    previous: Option<&str>,
    messages: &[ChatMessage],
    budget: usize,
    words: u64,
) -> Vec<ChatMessage> {
    let system = format!(
        "You summarize a conversation between a person and an assistant so that the \
         assistant can go on without it. Keep what the person asked for and still wants, \
         facts, names, numbers, identifiers (waitpoint, device and job ids), decisions, \
         what the tools did and returned, and what is still open. Leave out greetings and \
         repetition. At most {words} words; write only the summary."
    );
    let mut lines: Vec<String> = messages.iter().map(line).collect();
    let fixed = system.len() + previous.map_or(0, str::len) + 200;
    let mut left_out = 0;
    while !lines.is_empty() && fixed + lines.iter().map(|l| l.len() + 1).sum::<usize>() > budget {
        lines.remove(0);
        left_out += 1;
    }
    let mut user = String::new();
    if let Some(p) = previous {
        user.push_str(&format!("The summary so far:\n{p}\n\n"));
    }
    user.push_str("The conversation since:\n");
    if left_out > 0 {
        user.push_str(&format!("(… {left_out} earlier messages left out)\n"));
    }
    for l in &lines {
        user.push_str(l);
        user.push('\n');
    }
    user.push_str("\nWrite the summary now.");
    vec![ChatMessage::system(system), ChatMessage::user(user)]
}

fn line(m: &ChatMessage) -> String {
    let who = match m.role {
        Role::System => "system",
        Role::User => "person",
        Role::Assistant => "assistant",
        Role::Tool => "tool result",
    };
    let mut text = cut_chars(m.content.as_deref().unwrap_or_default().trim());
    for c in &m.tool_calls {
        let call = format!("[calls {} {}]", c.function.name, c.function.arguments);
        text = match text.is_empty() {
            true => cut_chars(&call),
            false => format!("{text} {}", cut_chars(&call)),
        };
    }
    format!("{who}: {text}")
}

fn cut_chars(s: &str) -> String {
    match s.char_indices().nth(MESSAGE_CHARS) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// Whether the server refused the request for its size: llama.cpp's 400 "exceeds the
/// available context size", OpenAI's `context_length_exceeded` ("maximum context
/// length"), and the like.
pub fn is_context_refusal(e: &ModelError) -> bool {
    let text = match e {
        ModelError::Status {
            status, excerpt, ..
        } if (400..500).contains(status) => excerpt,
        ModelError::Server { message, .. } => message,
        _ => return false,
    };
    let t = text.to_ascii_lowercase();
    [
        "context size",
        "context length",
        "context_length_exceeded",
        "context window",
        "too many tokens",
        "prompt is too long",
    ]
    .iter()
    .any(|k| t.contains(k))
}

/// The context a refusal for size names: llama.cpp's `"n_ctx": 2048`, OpenAI's
/// "maximum context length is 8192 tokens".
pub fn refusal_context(e: &ModelError) -> Option<u64> {
    number_after(e, "\"n_ctx\"").or_else(|| number_after(e, "maximum context length is"))
}

/// The request's tokens a refusal for size names: llama.cpp's `"n_prompt_tokens": 2100`,
/// OpenAI's "your messages resulted in 9000 tokens".
pub fn refusal_prompt_tokens(e: &ModelError) -> Option<u64> {
    number_after(e, "\"n_prompt_tokens\"").or_else(|| number_after(e, "resulted in"))
}

/// The whole number right after `key` in a refusal's body.
fn number_after(e: &ModelError, key: &str) -> Option<u64> {
    let ModelError::Status { excerpt, .. } = e else {
        return None;
    };
    let at = excerpt.find(key)? + key.len();
    let digits: String = excerpt[at..]
        .trim_start_matches([':', ' ', '"'])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse::<u64>().ok().filter(|&n| n > 0)
}

/// Why a compaction found nothing to summarize: `after` messages after the prefix and the
/// last summary; when the prefix and the tools (`fixed`) with the answer's room already
/// fill the context, what to change.
pub fn nothing_to_compact(after: usize, fixed: u64, reserve: u64, context: u64) -> String {
    let messages = if after == 1 { "message" } else { "messages" };
    let mut why = format!(
        "nothing to compact: the transcript holds {after} {messages} after the prefix and the last summary"
    );
    if context > 0 && fixed + reserve >= context {
        why.push_str(&format!(
            "; the prefix and the tools alone hold ~{fixed} of the model's {context} tokens: show fewer tools (policy.allow), shorten the instructions, or use a model with a bigger context"
        ));
    }
    why
}

/// One compaction to compute.
pub struct Job {
    /// The stored transcript (secrets redacted: a summary never holds one).
    pub messages: Vec<ChatMessage>,
    pub prefix_len: u64,
    pub summary: Option<Summary>,
    pub context: u64,
    /// The session's `maxTokens`: room kept for the answer.
    pub max_tokens: Option<u32>,
    pub per_byte: f64,
    /// The bytes a request carries besides its messages (the tools).
    pub overhead: usize,
    pub cause: &'static str,
}

impl Job {
    /// The first position the summary covers: after the prefix, or the last summary.
    pub fn from(&self) -> u64 {
        self.summary.as_ref().map_or(self.prefix_len, |s| s.through)
    }

    /// The estimated tokens of a request with `summary` in force.
    fn estimate(&self, summary: Option<&Summary>) -> u64 {
        let bytes: usize = context(&self.messages, self.prefix_len, summary)
            .iter()
            .map(message_bytes)
            .sum();
        tokens(bytes + self.overhead, self.per_byte)
    }
}

/// Computes job `j` with `model`: where to cut, then the summary call. Always answers:
/// a compaction without a summary says why in `error`.
pub async fn summarize(model: &dyn Model, j: &Job) -> Compaction {
    let from = j.from();
    let before = j.estimate(j.summary.as_ref());
    let mut c = Compaction {
        cause: j.cause.to_string(),
        from,
        through: from,
        tokens_before: before,
        tokens_after: before,
        context_tokens: j.context,
        ..Compaction::default()
    };
    let roles: Vec<Role> = j.messages.iter().map(|m| m.role).collect();
    let sizes: Vec<u64> = j
        .messages
        .iter()
        .map(|m| tokens(message_bytes(m), j.per_byte))
        .collect();
    let start = usize::try_from(from).unwrap_or(usize::MAX).min(sizes.len());
    let prefix = usize::try_from(j.prefix_len)
        .unwrap_or(usize::MAX)
        .min(sizes.len());
    let fixed = tokens(j.overhead, j.per_byte) + sizes[..prefix].iter().sum::<u64>();
    let forced = (j.cause == "forced").then(|| sizes[start..].iter().sum::<u64>());
    let keep = keep(j.context, reserve(j.max_tokens, j.context), fixed, forced);
    let Some(through) = cut(&roles, &sizes, start, keep) else {
        let after = j.messages.len().saturating_sub(start);
        let reserve = reserve(j.max_tokens, j.context);
        c.error = Some(nothing_to_compact(after, fixed, reserve, j.context));
        return c;
    };
    let range = &j.messages[start..through];
    let previous = j.summary.as_ref().map(|s| s.text.as_str());
    c.through = through as u64;
    c.digest = digest(previous, range);
    let answer = summary_room(j.context);
    let words = answer * 3 / 4;
    let budget = ((j.context.saturating_sub(answer + 64)) as f64 / j.per_byte) as usize;
    let prompt = summary_prompt(previous, range, budget, words);
    let started = Instant::now();
    let mut ignore = |_| {};
    let out = model
        .step(
            StepRequest {
                messages: &prompt,
                tools: &[],
                max_tokens: Some(u32::try_from(answer).unwrap_or(512)),
                response_format: None,
                tool_choice_required: false,
            },
            &mut ignore,
        )
        .await;
    c.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match out {
        Ok(out) if !out.text.trim().is_empty() => {
            c.usage = out.usage.unwrap_or(Usage::default());
            c.summary = out.text.trim().to_string();
            let after = Summary {
                through: c.through,
                text: c.summary.clone(),
                count: 0,
            };
            c.tokens_after = j.estimate(Some(&after));
        }
        Ok(_) => c.error = Some("the model wrote an empty summary".into()),
        Err(e) => c.error = Some(format!("the summary's model call failed: {e}")),
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use Role::*;

    #[test]
    fn when_to_compact() {
        // (estimate, reserve, context, plan)
        let cases = [
            (100, 100, 2048, Plan::Fits),
            (1_300, 200, 2048, Plan::Fits),
            // 75 % of 2,048 is 1,536.
            (1_336, 200, 2048, Plan::Soon),
            (1_848, 200, 2048, Plan::Soon),
            (1_849, 200, 2048, Plan::Now),
            (5_000, 0, 2048, Plan::Now),
            // An unknown context never compacts before a refusal.
            (1_000_000, 0, 0, Plan::Fits),
        ];
        for (est, res, ctx, want) in cases {
            assert_eq!(plan(est, res, ctx), want, "{est} + {res} of {ctx}");
        }
        assert_eq!(reserve(Some(256), 2048), 256);
        assert_eq!(reserve(Some(4096), 2048), 512, "at most a quarter");
        assert_eq!(reserve(None, 2048), 256, "an eighth without a cap");
    }

    #[test]
    fn what_is_kept() {
        // (context, reserve, fixed, forced, keep)
        let cases = [
            // 1,536 below the threshold, less 256 reserve, 700 fixed, 256 summary: 324 / 2.
            (2048, 256, 700, None, 162),
            (2048, 64, 700, None, 258),
            // A prefix over the threshold leaves nothing: the last message is kept alone.
            (2048, 256, 1_600, None, 0),
            (8192, 512, 1_000, None, 2_060),
            // A person's ask: at most a quarter of what it could summarize.
            (100_000, 512, 3_000, Some(480), 120),
            (2048, 256, 700, Some(10_000), 162),
        ];
        for (context, reserve, fixed, forced, want) in cases {
            assert_eq!(
                keep(context, reserve, fixed, forced),
                want,
                "{context} {reserve} {fixed} {forced:?}"
            );
        }
    }

    #[test]
    fn nothing_to_compact_says_when_the_prefix_is_the_problem() {
        let plain = nothing_to_compact(1, 700, 256, 2048);
        assert!(
            plain.ends_with("holds 1 message after the prefix and the last summary"),
            "{plain}"
        );
        let full = nothing_to_compact(2, 3_300, 256, 2048);
        assert!(full.contains("2 messages"), "{full}");
        assert!(full.contains("~3300 of the model's 2048 tokens"), "{full}");
        assert!(full.contains("policy.allow"), "{full}");
        assert!(
            !nothing_to_compact(1, 3_300, 0, 0).contains("policy"),
            "context unknown"
        );
    }

    #[test]
    fn where_to_cut() {
        // (roles, sizes, from, keep, through)
        let chat = [
            System, User, Assistant, User, Assistant, User, Assistant, User,
        ];
        let tools = [System, User, Assistant, Tool, Tool, Assistant, User];
        type Case<'a> = (&'a [Role], &'a [u64], usize, u64, Option<usize>);
        let cases: [Case<'_>; 9] = [
            // Keeps the most recent messages within `keep`, as many as fit.
            (&chat, &[50, 10, 10, 10, 10, 10, 10, 10], 1, 30, Some(5)),
            (&chat, &[50, 10, 10, 10, 10, 10, 10, 10], 1, 45, Some(4)),
            (&chat, &[50, 10, 10, 10, 10, 10, 10, 10], 1, 20, Some(6)),
            // Never a tail that starts with a tool's answer: the call stays with it.
            (&tools, &[50, 10, 10, 10, 10, 10, 10], 1, 35, Some(5)),
            (&tools, &[50, 10, 10, 10, 10, 10, 10], 1, 55, Some(2)),
            // A last message bigger than `keep` is kept whole.
            (&chat, &[50, 10, 10, 10, 10, 10, 10, 900], 1, 30, Some(7)),
            // Nothing before the last message: nothing to summarize.
            (&chat, &[50, 10, 10, 10, 10, 10, 10, 10], 7, 30, None),
            (&chat[..2], &[50, 10], 1, 30, None),
            // From the end of the last summary on; all of it fits, still one is summarized.
            (&chat, &[50, 10, 10, 10, 10, 10, 10, 10], 5, 100, Some(6)),
        ];
        for (roles, sizes, from, keep, want) in cases {
            assert_eq!(
                cut(roles, sizes, from, keep),
                want,
                "{roles:?} {sizes:?} from {from} keep {keep}"
            );
        }
    }

    fn transcript() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("be brief"),
            ChatMessage::user("watch job 7"),
            ChatMessage::assistant("armed wp_1", Vec::new()),
            ChatMessage::user("and job 8?"),
            ChatMessage::assistant("armed wp_2", Vec::new()),
        ]
    }

    #[test]
    fn a_request_carries_the_prefix_the_summary_and_the_rest() {
        let m = transcript();
        assert_eq!(context(&m, 1, None), m);
        let s = Summary {
            through: 3,
            text: "job 7 is watched by wp_1".into(),
            count: 1,
        };
        let got = context(&m, 1, Some(&s));
        assert_eq!(got[0], m[0], "the prefix stays as it was");
        assert_eq!(got[1].role, User);
        assert!(
            got[1]
                .content
                .as_deref()
                .is_some_and(|c| c.starts_with(SUMMARY_HEAD) && c.ends_with("wp_1")),
            "{got:?}"
        );
        // The kept part begins with the person's message: an acknowledgement between.
        assert_eq!(got[2].content.as_deref(), Some(SUMMARY_ACK));
        assert_eq!(&got[3..], &m[3..]);
        let s = Summary { through: 4, ..s };
        let got = context(&m, 1, Some(&s));
        assert_eq!(
            got.len(),
            3,
            "no acknowledgement before an assistant's message"
        );
        assert_eq!(got[2], m[4]);
    }

    #[test]
    fn a_summary_is_taken_only_while_it_matches_what_it_was_computed_from() {
        let m = transcript();
        let earlier = Summary {
            through: 3,
            text: "before".into(),
            count: 1,
        };
        let good = |from: u64, through: u64, prev: Option<&str>| Compaction {
            cause: "threshold".into(),
            from,
            through,
            digest: digest(prev, &m[from as usize..through as usize]),
            summary: "s".into(),
            ..Compaction::default()
        };
        let from = |n: u64| &m[n as usize..];
        // (compaction, summary in force, outcome)
        let mut edited = m.clone();
        edited[1].content = Some("watch job 9".into());
        let cases: Vec<(Compaction, Option<&Summary>, &[ChatMessage], bool)> = vec![
            (good(1, 3, None), None, from(1), true),
            (good(3, 4, Some("before")), Some(&earlier), from(3), true),
            // Another compaction was taken meanwhile.
            (good(1, 3, None), Some(&earlier), from(3), false),
            // Computed over other messages, or another summary.
            (good(1, 3, None), None, &edited[1..], false),
            (good(3, 4, Some("other")), Some(&earlier), from(3), false),
            // A range the transcript does not hold, or none.
            (good(1, 3, None), None, &m[1..2], false),
            (
                Compaction {
                    through: 1,
                    ..good(1, 3, None)
                },
                None,
                from(1),
                false,
            ),
            (
                Compaction {
                    summary: " ".into(),
                    ..good(1, 3, None)
                },
                None,
                from(1),
                false,
            ),
            (
                Compaction {
                    error: Some("x".into()),
                    ..good(1, 3, None)
                },
                None,
                from(1),
                false,
            ),
        ];
        for (n, (c, s, stored, ok)) in cases.into_iter().enumerate() {
            assert_eq!(valid(&c, 1, s, stored).is_ok(), ok, "case {n}: {c:?}");
        }
    }

    #[test]
    fn the_summary_call_fits_its_budget() {
        let long = "x".repeat(5_000);
        let mut m = vec![ChatMessage::user(long.clone())];
        for i in 0..50 {
            m.push(ChatMessage::user(format!("message {i}")));
        }
        let p = summary_prompt(Some("the summary so far"), &m, 1_600, 100);
        assert_eq!(p.len(), 2);
        let user = p[1].content.clone().unwrap_or_default();
        assert!(
            user.contains("The summary so far:\nthe summary so far"),
            "{user}"
        );
        assert!(user.contains("message 49"), "the newest stay: {user}");
        assert!(user.contains("earlier messages left out"), "{user}");
        assert!(!user.contains(&long), "{user}");
        let whole = summary_prompt(None, &m[1..3], 100_000, 100);
        let user = whole[1].content.clone().unwrap_or_default();
        assert!(
            user.contains("person: message 0\nperson: message 1\n"),
            "{user}"
        );
        assert!(!user.contains("left out"), "{user}");
    }

    #[test]
    fn refusals_for_size_are_told_from_others() {
        let status = |status: u16, excerpt: &str| ModelError::Status {
            url: "u".into(),
            status,
            excerpt: excerpt.into(),
            retry_after: None,
        };
        let cases = [
            (
                status(
                    400,
                    "the request exceeds the available context size, try increasing it",
                ),
                true,
            ),
            (
                status(
                    400,
                    "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
                ),
                true,
            ),
            (status(400, "context_length_exceeded"), true),
            (status(400, "bad request"), false),
            (status(500, "context size"), false),
            (ModelError::Truncated, false),
        ];
        for (e, want) in cases {
            assert_eq!(is_context_refusal(&e), want, "{e}");
        }
        let llama = status(
            400,
            r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":2100,"n_ctx": 2048}}"#,
        );
        assert_eq!(refusal_context(&llama), Some(2048));
        assert_eq!(refusal_prompt_tokens(&llama), Some(2100));
        let openai = status(
            400,
            "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
        );
        assert_eq!(refusal_context(&openai), Some(8192));
        assert_eq!(refusal_prompt_tokens(&openai), Some(9000));
        assert_eq!(refusal_context(&status(400, "context size")), None);
    }
}
