//! The gate before every tool call: a session's policy (lists of tool names over the
//! hub's defaults) and what a person allowed for the rest of the session decide whether
//! a call runs, is refused (the model is told, and goes on), or waits for a person.

use cortex_protocol::api::Policy;

use super::tools;

/// What the gate decided for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    Allow,
    /// Refused: the model reads this as the call's error.
    Deny(String),
    /// A person decides; the reason is shown to them.
    Ask(String),
}

/// The tools a gate asks about unless a policy names its own `requireApproval`.
pub const ASK_BY_DEFAULT: &[&str] = &["device_exec"];

fn names(list: Option<&Vec<String>>, tool: &str) -> bool {
    list.is_some_and(|l| l.iter().any(|n| n == "*" || n == tool))
}

/// The rule, in order: `deny` refuses; a tool a person allowed `always` runs;
/// `requireApproval` asks; a tool missing from a given `allow` list is refused; the rest
/// runs.
pub fn gate(policy: &Policy, always: &[String], tool: &str) -> Gate {
    if names(policy.deny.as_ref(), tool) {
        return Gate::Deny(format!(
            "{tool} is denied by this session's policy (policy.deny); do without it"
        ));
    }
    if always.iter().any(|t| t == tool) {
        return Gate::Allow;
    }
    if names(policy.require_approval.as_ref(), tool) {
        return Gate::Ask(format!(
            "{tool} needs a person's approval (policy.requireApproval)"
        ));
    }
    if policy.allow.is_some() && !names(policy.allow.as_ref(), tool) {
        return Gate::Deny(format!(
            "{tool} is not on this session's allow list (policy.allow); do without it"
        ));
    }
    Gate::Allow
}

pub use super::tools::shown;

/// The tools a session with `policy` is shown, in [`tools::specs`]' order (fixed for the
/// session: its requests all start with the same bytes).
pub fn shown_specs(policy: &Policy) -> Vec<crate::model::ToolSpec> {
    let devices = shown(policy, "devices");
    tools::specs()
        .into_iter()
        .filter(|s| shown(policy, &s.name))
        .map(|mut s| {
            // A parameter's description names `devices` only where the model may call it.
            if !devices {
                unname_devices(&mut s.parameters);
            }
            s
        })
        .collect()
}

/// What a parameter's description says of a device, without the `devices` tool.
const DEVICE_NAMED: (&str, &str) = (
    "the device's name, as `devices` lists it",
    "the device's name",
);

fn unname_devices(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) if s.contains(DEVICE_NAMED.0) => {
            *s = s.replace(DEVICE_NAMED.0, DEVICE_NAMED.1);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(unname_devices),
        serde_json::Value::Object(o) => o.values_mut().for_each(unname_devices),
        _ => {}
    }
}

/// A session's policy over the hub's: each list the session gives replaces the hub's,
/// and `requireApproval` given by neither is [`ASK_BY_DEFAULT`]. `Err` names a list entry
/// that is no tool.
pub fn resolve(session: Option<Policy>, hub: Option<Policy>) -> Result<Policy, String> {
    let s = session.unwrap_or_default();
    let h = hub.unwrap_or_default();
    let allow = s.allow.or(h.allow);
    // The default asks never widen a given allow list: with `allow: ["devices"]`,
    // `device_exec` is refused (and not shown), not asked about.
    let default_asks = || {
        ASK_BY_DEFAULT
            .iter()
            .filter(|t| allow.is_none() || names(allow.as_ref(), t))
            .map(|t| t.to_string())
            .collect()
    };
    let p = Policy {
        deny: s.deny.or(h.deny),
        require_approval: s
            .require_approval
            .or(h.require_approval)
            .or_else(|| Some(default_asks())),
        approval_timeout_ms: s.approval_timeout_ms.or(h.approval_timeout_ms),
        allow,
    };
    if p.approval_timeout_ms == Some(0) {
        return Err(
            "policy.approvalTimeoutMs must be above 0 (leave it out to wait as long as it takes)"
                .into(),
        );
    }
    let known: Vec<String> = tools::specs().into_iter().map(|t| t.name).collect();
    for (field, list) in [
        ("allow", &p.allow),
        ("deny", &p.deny),
        ("requireApproval", &p.require_approval),
    ] {
        for name in list.iter().flatten() {
            if name.trim().is_empty() {
                return Err(format!(
                    "policy.{field} holds an empty tool name; to name no tool give an empty list (\"{field}\": []; on the command line --allow '' shows the model no tools)"
                ));
            }
            if name != "*" && !known.contains(name) {
                return Err(format!(
                    "policy.{field} names {name:?}, which is no tool; the tools are {} (or \"*\" for all)",
                    known.join(", ")
                ));
            }
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[&str]) -> Option<Vec<String>> {
        Some(names.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn the_rule_in_order() {
        let p = Policy {
            allow: list(&["wait_create", "device_exec"]),
            deny: list(&["wait_cancel"]),
            require_approval: list(&["device_exec", "wait_cancel"]),
            approval_timeout_ms: None,
        };
        let always = vec!["devices".to_string()];
        let cases: &[(&str, &[String], &str)] = &[
            // deny beats everything, even a listed approval
            ("wait_cancel", &[], "deny"),
            ("wait_cancel", &always, "deny"),
            ("device_exec", &[], "ask"),
            ("device_exec", &["device_exec".to_string()], "allow"),
            ("wait_create", &[], "allow"),
            // not on the given allow list
            ("wait_check", &[], "deny"),
            // ... unless a person allowed it for the session
            ("devices", &always, "allow"),
        ];
        for (tool, always, want) in cases {
            let got = match gate(&p, always, tool) {
                Gate::Allow => "allow",
                Gate::Deny(_) => "deny",
                Gate::Ask(_) => "ask",
            };
            assert_eq!(got, *want, "{tool} with always={always:?}");
        }
        let everything = Policy {
            require_approval: list(&["*"]),
            ..Policy::default()
        };
        assert!(matches!(gate(&everything, &[], "devices"), Gate::Ask(_)));
        assert_eq!(gate(&Policy::default(), &[], "devices"), Gate::Allow);
    }

    #[test]
    fn the_model_is_shown_only_what_it_may_call() {
        let p = Policy {
            allow: list(&["wait_create"]),
            deny: list(&["devices"]),
            require_approval: list(&["device_exec"]),
            approval_timeout_ms: None,
        };
        assert!(shown(&p, "wait_create"));
        assert!(shown(&p, "device_exec"), "asked about: shown");
        assert!(!shown(&p, "devices"), "denied");
        assert!(!shown(&p, "wait_check"), "not on the allow list");
        let open = Policy::default();
        assert!(shown(&open, "wait_check"));
        let none = Policy {
            deny: list(&["*"]),
            ..Policy::default()
        };
        assert!(!shown(&none, "wait_check"));
    }

    /// The device waits' parameters name `devices` only where the model is shown it.
    #[test]
    fn specs_name_devices_only_where_shown() {
        let described = |p: &Policy| serde_json::to_string(&shown_specs(p)).unwrap_or_default();
        assert!(described(&Policy::default()).contains("as `devices` lists it"));
        let no_devices = Policy {
            deny: list(&["devices"]),
            ..Policy::default()
        };
        assert!(!described(&no_devices).contains("`devices`"));
    }

    #[test]
    fn a_session_list_replaces_the_hubs_and_exec_asks_by_default() {
        let hub = Policy {
            deny: list(&["devices"]),
            approval_timeout_ms: Some(5_000),
            ..Policy::default()
        };
        let p = resolve(None, Some(hub.clone())).expect("valid");
        assert_eq!(p.deny, list(&["devices"]));
        assert_eq!(p.require_approval, list(&["device_exec"]));
        assert_eq!(p.approval_timeout_ms, Some(5_000));
        let own = Policy {
            deny: Some(Vec::new()),
            require_approval: Some(Vec::new()),
            ..Policy::default()
        };
        let p = resolve(Some(own), Some(hub)).expect("valid");
        assert_eq!(p.deny, Some(Vec::new()));
        assert_eq!(p.require_approval, Some(Vec::new()));
        // The default ask stays within a given allow list.
        let narrow = Policy {
            allow: list(&["device_wait_pid"]),
            ..Policy::default()
        };
        let p = resolve(Some(narrow), None).expect("valid");
        assert_eq!(p.require_approval, Some(Vec::new()));
        assert!(matches!(gate(&p, &[], "device_exec"), Gate::Deny(_)));
        assert!(!shown(&p, "device_exec"));
        let exec = Policy {
            allow: list(&["device_exec"]),
            ..Policy::default()
        };
        let p = resolve(Some(exec), None).expect("valid");
        assert!(matches!(gate(&p, &[], "device_exec"), Gate::Ask(_)));
        assert!(
            resolve(
                Some(Policy {
                    approval_timeout_ms: Some(0),
                    ..Policy::default()
                }),
                None
            )
            .is_err()
        );
    }
}
