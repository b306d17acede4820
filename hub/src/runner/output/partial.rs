//! The partial JSON parse behind `output-partial`: the best-effort value of an envelope
//! still streaming. Open strings, arrays and objects are closed where the text stops; a
//! key without its value is dropped, and so is a number or literal that may not be whole.

use serde_json::{Map, Value};

/// The envelope so far: the object that starts at the first `{` of `text` (so prose or a
/// code fence before it is skipped), as far as it goes. `None` before any `{`. A string
/// value cut short is kept as far as it goes (a `response` streams as it forms); text
/// that breaks JSON ends the value where it breaks.
pub fn partial_object(text: &str) -> Option<Value> {
    let start = text.find('{')?;
    let mut p = Parser {
        s: &text.as_bytes()[start..],
        text: &text[start..],
        i: 0,
    };
    match p.value() {
        Part::Whole(v) | Part::Cut(Some(v)) => Some(v),
        Part::Cut(None) => None,
    }
}

/// A value read whole, or one the text stopped (or broke) inside, with what there is.
enum Part {
    Whole(Value),
    Cut(Option<Value>),
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
}

impl Parser<'_> {
    fn peek(&mut self) -> Option<u8> {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
        self.s.get(self.i).copied()
    }

    fn value(&mut self) -> Part {
        match self.peek() {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => match self.string() {
                Ok(s) => Part::Whole(Value::String(s)),
                Err(s) => Part::Cut(Some(Value::String(s))),
            },
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            _ => Part::Cut(None),
        }
    }

    fn object(&mut self) -> Part {
        self.i += 1;
        let mut map = Map::new();
        loop {
            match self.peek() {
                Some(b'}') => {
                    self.i += 1;
                    return Part::Whole(Value::Object(map));
                }
                Some(b',') => self.i += 1,
                Some(b'"') => {
                    // A key cut short, or one with no value yet, is dropped.
                    let Ok(key) = self.string() else { break };
                    if self.peek() != Some(b':') {
                        break;
                    }
                    self.i += 1;
                    match self.value() {
                        Part::Whole(v) => {
                            map.insert(key, v);
                        }
                        Part::Cut(v) => {
                            if let Some(v) = v {
                                map.insert(key, v);
                            }
                            break;
                        }
                    }
                }
                _ => break,
            }
        }
        Part::Cut(Some(Value::Object(map)))
    }

    fn array(&mut self) -> Part {
        self.i += 1;
        let mut items = Vec::new();
        loop {
            match self.peek() {
                Some(b']') => {
                    self.i += 1;
                    return Part::Whole(Value::Array(items));
                }
                Some(b',') => self.i += 1,
                _ => match self.value() {
                    Part::Whole(v) => items.push(v),
                    Part::Cut(v) => {
                        items.extend(v);
                        break;
                    }
                },
            }
        }
        Part::Cut(Some(Value::Array(items)))
    }

    /// A string from its opening quote: `Ok` when closed, `Err` with what there is when
    /// the text stops first (an escape cut short is left out).
    fn string(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut out = String::new();
        let mut run = self.i;
        while let Some(&b) = self.s.get(self.i) {
            match b {
                b'"' => {
                    out.push_str(&self.text[run..self.i]);
                    self.i += 1;
                    return Ok(out);
                }
                b'\\' => {
                    out.push_str(&self.text[run..self.i]);
                    match self.escape() {
                        Some(c) => out.push(c),
                        None => return Err(out),
                    }
                    run = self.i;
                }
                _ => self.i += 1,
            }
        }
        out.push_str(&self.text[run..]);
        Err(out)
    }

    /// The escape at `self.i` (a backslash); `None` when cut short or not valid.
    fn escape(&mut self) -> Option<char> {
        let c = match *self.s.get(self.i + 1)? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.unicode(),
            _ => return None,
        };
        self.i += 2;
        Some(c)
    }

    /// A `\u` escape of four hex digits, with its low surrogate when it is a high one.
    fn unicode(&mut self) -> Option<char> {
        let hex = |at: usize| -> Option<u32> {
            let digits = self.text.get(at..at + 4)?;
            u32::from_str_radix(digits, 16).ok()
        };
        let first = hex(self.i + 2)?;
        if (0xD800..0xDC00).contains(&first) {
            if self.s.get(self.i + 6..self.i + 8)? != b"\\u" {
                return None;
            }
            let low = hex(self.i + 8)?;
            self.i += 12;
            return char::from_u32(0x10000 + ((first - 0xD800) << 10) + (low.checked_sub(0xDC00)?));
        }
        self.i += 6;
        char::from_u32(first)
    }

    /// A number; at the end of the text it may not be whole yet and is left out.
    fn number(&mut self) -> Part {
        let start = self.i;
        while self
            .s
            .get(self.i)
            .is_some_and(|b| b.is_ascii_digit() || b"+-.eE".contains(b))
        {
            self.i += 1;
        }
        if self.i == self.s.len() {
            return Part::Cut(None);
        }
        match serde_json::from_str::<Value>(&self.text[start..self.i]) {
            Ok(n) => Part::Whole(n),
            Err(_) => Part::Cut(None),
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Part {
        let rest = &self.s[self.i..];
        if rest.starts_with(word.as_bytes()) {
            self.i += word.len();
            Part::Whole(value)
        } else {
            Part::Cut(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_streaming_envelope_reads_as_far_as_it_goes() {
        let cases: &[(&str, Option<Value>)] = &[
            ("", None),
            ("Sure, here", None),
            ("{", Some(json!({}))),
            (r#"{"resp"#, Some(json!({}))),
            (r#"{"response""#, Some(json!({}))),
            (r#"{"response":"#, Some(json!({}))),
            (r#"{"response": "Hel"#, Some(json!({"response": "Hel"}))),
            (
                r#"{"response": "Hello", "da"#,
                Some(json!({"response": "Hello"})),
            ),
            (
                r#"{"response": "a\"b\n"#,
                Some(json!({"response": "a\"b\n"})),
            ),
            (r#"{"response": "a\"#, Some(json!({"response": "a"}))),
            (
                r#"{"response": "caf\u00e9 \u00"#,
                Some(json!({"response": "café "})),
            ),
            (r#"{"r": "\ud83d\ude00!"#, Some(json!({"r": "😀!"}))),
            (r#"{"r": "\ud83d"#, Some(json!({"r": ""}))),
            (
                r#"{"data": {"items": [1, 2, {"a": tr"#,
                Some(json!({"data": {"items": [1, 2, {}]}})),
            ),
            (r#"{"data": {"n": 12"#, Some(json!({"data": {}}))),
            (r#"{"data": {"n": 12,"#, Some(json!({"data": {"n": 12}}))),
            (
                r#"{"data": {"n": -1.5e3}"#,
                Some(json!({"data": {"n": -1500.0}})),
            ),
            (
                r#"{"data": [true, false, null, "x"#,
                Some(json!({"data": [true, false, null, "x"]})),
            ),
            (r#"{"data": []}"#, Some(json!({"data": []}))),
            (
                "```json\n{\"response\": \"hi\"}\n```",
                Some(json!({"response": "hi"})),
            ),
            (r#"{"a": 1} trailing {"b": 2}"#, Some(json!({"a": 1}))),
            // Broken JSON ends the value where it breaks.
            (r#"{"a": 1, "b": oops, "c": 3}"#, Some(json!({"a": 1}))),
            (r#"{"a": 1, 7: 2}"#, Some(json!({"a": 1}))),
            ("{\"é\": \"ü", Some(json!({"é": "ü"}))),
        ];
        for (text, want) in cases {
            assert_eq!(partial_object(text), *want, "{text}");
        }
    }

    #[test]
    fn every_prefix_of_a_whole_envelope_parses_and_the_whole_is_exact() {
        let whole = json!({"response": "done – ok", "data": {"list": [1, {"k": "v\\\""}], "f": false}, "reasoning": null});
        let text = serde_json::to_string_pretty(&whole).expect("encode");
        for end in (0..=text.len()).filter(|e| text.is_char_boundary(*e)) {
            let got = partial_object(&text[..end]);
            assert_eq!(got.is_some(), end > 0, "{}", &text[..end]);
        }
        assert_eq!(partial_object(&text), Some(whole));
    }
}
