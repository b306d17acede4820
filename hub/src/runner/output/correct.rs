//! The corrections appended in the loop when a turn ends without a valid envelope: the
//! texts the model reads before it answers again in the same run.

use std::fmt::Write as _;

use super::envelope::Issue;
use super::transport::Transport;

/// Issues listed in one correction; the rest are counted.
const ISSUES_SHOWN: usize = 10;

/// The correction for an answer that parsed and was refused (it counts against
/// `outputRetries`): the validator's issues, each with where and why, and how to answer
/// again on `transport`.
pub fn refused(issues: &[Issue], transport: Transport) -> String {
    let mut out = String::from("Your answer does not match the output schema:\n");
    for issue in issues.iter().take(ISSUES_SHOWN) {
        let _ = writeln!(out, "- {issue}");
    }
    if issues.len() > ISSUES_SHOWN {
        let _ = writeln!(out, "- and {} more", issues.len() - ISSUES_SHOWN);
    }
    out.push_str("Fix these and answer again: ");
    out.push_str(exits(transport));
    out
}

/// The correction for a turn that ended with no envelope in it (prose, or JSON broken
/// past reading): it does not count against `outputRetries`. It offers every exit
/// `transport` has (under `respond`: call `respond`, or reply with only the envelope)
/// and quotes the parse error when the text started as JSON.
pub fn no_envelope(transport: Transport, syntax: Option<&str>) -> String {
    let mut out = String::from("Your turn ended without an answer in the required form.");
    if let Some(e) = syntax {
        let _ = write!(out, " The JSON in it does not parse ({e}).");
    }
    out.push_str(" If you are done, ");
    out.push_str(exits(transport));
    out.push_str(" If you are not done, go on with your work.");
    out
}

/// The ways to end a turn with an answer on `transport`.
fn exits(transport: Transport) -> &'static str {
    match transport {
        Transport::Respond => {
            "call `respond` alone with the answer object as its arguments, or reply with only \
             the answer object as JSON (no text before or after it)."
        }
        Transport::Emit | Transport::Native => {
            "reply with only the answer object as JSON (no text before or after it, no tool \
             call)."
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issue(path: &str, message: &str) -> Issue {
        Issue {
            path: path.into(),
            message: message.into(),
        }
    }

    #[test]
    fn a_refused_answer_lists_its_issues_and_how_to_answer_again() {
        let issues = [
            issue("/data/age", r#""x" is not of type "integer""#),
            issue("", "missing data"),
        ];
        let text = refused(&issues, Transport::Emit);
        assert_eq!(
            text,
            "Your answer does not match the output schema:\n\
             - at /data/age: \"x\" is not of type \"integer\"\n\
             - the answer as a whole: missing data\n\
             Fix these and answer again: reply with only the answer object as JSON (no text \
             before or after it, no tool call)."
        );
        let many: Vec<Issue> = (0..12)
            .map(|i| issue(&format!("/data/{i}"), "bad"))
            .collect();
        let text = refused(&many, Transport::Respond);
        assert!(text.contains("- at /data/9: bad\n- and 2 more\n"), "{text}");
        assert!(!text.contains("/data/10"), "{text}");
        assert!(
            text.contains(&format!(
                "call `{}` alone",
                crate::runner::output::respond::RESPOND
            )),
            "{text}"
        );
    }

    /// (transport, syntax error, words the correction must hold, words it must not).
    #[test]
    fn no_envelope_offers_every_exit_of_the_transport() {
        type Case<'a> = (Transport, Option<&'a str>, &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                Transport::Respond,
                None,
                &["call `respond` alone", "reply with only the answer object"],
                &["parse"],
            ),
            (
                Transport::Emit,
                None,
                &["reply with only the answer object"],
                &["respond"],
            ),
            (
                Transport::Native,
                Some("EOF while parsing"),
                &["does not parse (EOF while parsing)"],
                &["`respond`"],
            ),
        ];
        for (transport, syntax, has, lacks) in cases {
            let text = no_envelope(*transport, *syntax);
            for w in *has {
                assert!(text.contains(w), "{text} lacks {w}");
            }
            for w in *lacks {
                assert!(!text.contains(w), "{text} has {w}");
            }
            assert!(text.ends_with("go on with your work."));
        }
    }
}
