//! The fence-tolerant parse of a turn that carries the envelope as text: the first
//! complete JSON object in it, whatever prose, code fence or trailing text surrounds it.

use serde_json::Value;

/// A turn with no complete JSON object in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoObject {
    /// The parse error of the first candidate that started as JSON (`{"` or `{}`), so
    /// a correction can say what broke; `None` when the text is prose.
    pub syntax: Option<String>,
}

/// The first complete JSON object in `text`. Every `{` is a candidate, left to right;
/// the first that parses as a whole value wins and anything after it is ignored (a
/// closing fence, a sign-off). A candidate that starts as JSON and breaks (or is cut
/// short) hides the `{`s inside what it read: they belong to it, and an inner object
/// must not pass for the answer.
pub fn first_object(text: &str) -> Result<Value, NoObject> {
    let mut syntax = None;
    let mut hidden_until = 0;
    for (at, _) in text.match_indices('{') {
        if at < hidden_until {
            continue;
        }
        let rest = &text[at..];
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match values.next() {
            Some(Ok(value)) => return Ok(value),
            Some(Err(e)) if starts_as_json(rest) => {
                hidden_until = at + offset(rest, e.line(), e.column());
                syntax.get_or_insert_with(|| e.to_string());
            }
            _ => {}
        }
    }
    Err(NoObject { syntax })
}

/// `{` followed (after whitespace) by a key or the closing brace.
fn starts_as_json(rest: &str) -> bool {
    matches!(rest[1..].trim_start().chars().next(), Some('"' | '}'))
}

/// The byte offset of serde_json's 1-based `line` and `column` in `text` (its end when
/// past it).
fn offset(text: &str, line: usize, column: usize) -> usize {
    let before: usize = text
        .split('\n')
        .take(line.saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum();
    (before + column).min(text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_first_complete_object_is_found_whatever_surrounds_it() {
        let cases: &[(&str, Option<Value>)] = &[
            (r#"{"response":"hi"}"#, Some(json!({"response": "hi"}))),
            ("  {\"a\": 1}\n", Some(json!({"a": 1}))),
            ("```json\n{\"a\": 1}\n```", Some(json!({"a": 1}))),
            ("```\n{\"a\": 1}\n```\n", Some(json!({"a": 1}))),
            (
                "Sure! Here it is:\n```json\n{\"a\": {\"b\": [1, 2]}}\n```\nAnything else?",
                Some(json!({"a": {"b": [1, 2]}})),
            ),
            (
                "The set {x} is empty; the answer: {\"a\": 1}",
                Some(json!({"a": 1})),
            ),
            (r#"{"a": 1} and then {"b": 2}"#, Some(json!({"a": 1}))),
            (
                r#"{"a": "a } brace"} tail"#,
                Some(json!({"a": "a } brace"})),
            ),
            ("{}", Some(json!({}))),
            ("no json here", None),
            ("[1, 2]", None),
            ("", None),
            // Broken outer object: the inner one must not pass for the answer.
            (r#"{"data": {"a": 1},}"#, None),
            // Cut short.
            (r#"{"response": "half"#, None),
        ];
        for (text, want) in cases {
            assert_eq!(first_object(text).ok(), *want, "{text}");
        }
    }

    #[test]
    fn a_broken_object_reports_its_syntax_error_and_prose_does_not() {
        let broken = first_object(r#"{"data": {"a": 1},}"#).expect_err("broken");
        assert!(broken.syntax.is_some_and(|s| s.contains("line 1")));
        assert_eq!(
            first_object("I think {maybe} so")
                .expect_err("prose")
                .syntax,
            None
        );
    }

    #[test]
    fn offsets_count_lines_and_columns() {
        assert_eq!(offset("ab\ncd", 2, 1), 4);
        assert_eq!(offset("ab", 1, 9), 2);
    }
}
