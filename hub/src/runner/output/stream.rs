//! The envelope as it streams: which pieces of a model turn carry the answer
//! (`output-delta`) and the envelope parsed so far (`output-partial`). Under `emit` and
//! `native` the completion's text is the answer; under `respond` the arguments of a call
//! named `respond` are (the text is prose then, or an envelope judged at the end). A chat
//! agent's answer is its text, which `model-delta` already carries: nothing streams here.
//!
//! The partial parse reads the whole text so far; it is made again only once the text
//! grew by an eighth since the last, so a long answer costs a small multiple of its
//! length rather than its square.

use serde_json::Value;

use super::respond::RESPOND;
use super::transport::Transport;

/// What one streamed piece adds to the answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    /// The piece itself (`output-delta`).
    pub delta: String,
    /// The envelope so far, when it changed since the last one sent (`output-partial`).
    pub partial: Option<Value>,
}

/// One model turn's answer as it streams.
#[derive(Debug, Clone, Default)]
pub struct Stream {
    /// Where the answer travels; `None`: a chat agent, nothing streams as output.
    on: Option<Transport>,
    /// The answer's text so far.
    text: String,
    /// The index of the tool call named `respond` (under `respond`).
    respond: Option<usize>,
    /// `text`'s length at the last parse.
    parsed_at: usize,
    last: Option<Value>,
}

impl Stream {
    /// A stream for a session whose answer travels on `on` (`None`: a chat agent).
    pub fn new(on: Option<Transport>) -> Stream {
        Stream {
            on,
            ..Stream::default()
        }
    }

    /// A piece of the completion's text.
    pub fn text(&mut self, piece: &str) -> Option<Piece> {
        match self.on {
            Some(Transport::Emit | Transport::Native) => self.grow(piece),
            _ => None,
        }
    }

    /// A piece of tool call `index`: its name when this piece carries it, and a fragment
    /// of its arguments.
    pub fn tool_args(&mut self, index: usize, name: Option<&str>, piece: &str) -> Option<Piece> {
        if self.on != Some(Transport::Respond) {
            return None;
        }
        if name == Some(RESPOND) && self.respond.is_none() {
            self.respond = Some(index);
        }
        if self.respond != Some(index) {
            return None;
        }
        self.grow(piece)
    }

    /// The model call is made again: what streamed so far is void.
    pub fn reset(&mut self) {
        *self = Stream::new(self.on);
    }

    fn grow(&mut self, piece: &str) -> Option<Piece> {
        if piece.is_empty() {
            return None;
        }
        self.text.push_str(piece);
        let mut partial = None;
        if self.text.len() - self.parsed_at >= self.parsed_at / 8 {
            self.parsed_at = self.text.len();
            let now = super::partial::partial_object(&self.text);
            if now.is_some() && now != self.last {
                partial.clone_from(&now);
                self.last = now;
            }
        }
        Some(Piece {
            delta: piece.to_owned(),
            partial,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn emit_streams_the_text_and_each_new_partial() {
        let mut s = Stream::new(Some(Transport::Emit));
        let a = s.text("{\"data\": {\"lo").expect("a piece");
        assert_eq!(a.delta, "{\"data\": {\"lo");
        let b = s.text("ss\": 0.5").expect("a piece");
        let c = s.text("}}").expect("a piece");
        // The last one parsed is whole; each partial sent differs from the one before.
        let sent: Vec<Value> = [a, b, c].into_iter().filter_map(|p| p.partial).collect();
        assert_eq!(sent.last(), Some(&json!({"data": {"loss": 0.5}})));
        assert!(sent.windows(2).all(|w| w[0] != w[1]));
        assert_eq!(s.text(""), None);
    }

    #[test]
    fn respond_streams_only_the_respond_calls_arguments() {
        let mut s = Stream::new(Some(Transport::Respond));
        assert_eq!(s.text("Let me answer."), None);
        assert_eq!(s.tool_args(0, Some("devices"), "{}"), None);
        let p = s
            .tool_args(1, Some(RESPOND), "{\"response\": \"do")
            .expect("piece");
        assert_eq!(p.partial, Some(json!({"response": "do"})));
        assert_eq!(s.tool_args(0, None, "x"), None);
        let p = s.tool_args(1, None, "ne\"}").expect("piece");
        assert_eq!(p.delta, "ne\"}");
        s.reset();
        assert_eq!(
            s.tool_args(1, None, "{"),
            None,
            "the call is unknown after a retry"
        );
    }

    #[test]
    fn a_chat_agent_streams_nothing_as_output() {
        let mut s = Stream::new(None);
        assert_eq!(s.text("hello"), None);
        assert_eq!(s.tool_args(0, Some(RESPOND), "{}"), None);
        let mut native = Stream::new(Some(Transport::Native));
        assert!(native.text("{").is_some());
        assert_eq!(native.tool_args(0, Some(RESPOND), "{}"), None);
    }

    #[test]
    fn a_long_answer_is_parsed_a_bounded_number_of_times() {
        let mut s = Stream::new(Some(Transport::Emit));
        s.text("{\"response\": \"");
        let mut parses = 0;
        for _ in 0..20_000 {
            let before = s.parsed_at;
            s.text("ab");
            if s.parsed_at != before {
                parses += 1;
            }
        }
        // Growth by an eighth each time: about log(40_000/16)/log(1.125) parses.
        assert!(parses < 120, "{parses} parses");
    }
}
