//! The rules that decide a remote wait's outcome when its agent did not report one, and
//! what an outcome counts as. Pure: the device's presence and the times are passed in.

use cortex_protocol::SignalStatus;
use cortex_protocol::mesh::WaitEnd;

/// The hub's deadline passed with no report from the agent: `timed_out` when the device
/// is online (its agent watched and should have said so by now), `broke` when it is
/// offline (nobody watched, so nobody can tell whether the condition held). The message
/// says which, with the bound (`bound`, human-readable) and what was waited on (`what`).
pub fn overdue(device: &str, what: &str, bound: &str, online: bool) -> (WaitEnd, String) {
    if online {
        (
            WaitEnd::TimedOut,
            format!(
                "timed out after {bound}: the agent on {device} reported no end of {what} within the bound"
            ),
        )
    } else {
        (
            WaitEnd::Broke,
            format!(
                "device {device} was offline when the bound of {bound} passed, so nobody can tell whether {what} ended; the wait broke"
            ),
        )
    }
}

/// The signal status an outcome is recorded as: only a fired wait is `ok`.
pub fn status(end: WaitEnd) -> SignalStatus {
    match end {
        WaitEnd::Fired => SignalStatus::Ok,
        WaitEnd::TimedOut | WaitEnd::Broke => SignalStatus::Fail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overdue_wait_times_out_only_where_someone_watched() {
        for (online, end, says) in [
            (true, WaitEnd::TimedOut, "timed out after 10s"),
            (
                false,
                WaitEnd::Broke,
                "was offline when the bound of 10s passed",
            ),
        ] {
            let (got, msg) = overdue("gpu1", "pid 42", "10s", online);
            assert_eq!(got, end, "online={online}");
            assert!(msg.contains(says), "{msg}");
            assert!(msg.contains("gpu1") && msg.contains("pid 42"), "{msg}");
        }
    }

    #[test]
    fn only_a_fired_wait_is_ok() {
        for (end, want) in [
            (WaitEnd::Fired, SignalStatus::Ok),
            (WaitEnd::TimedOut, SignalStatus::Fail),
            (WaitEnd::Broke, SignalStatus::Fail),
        ] {
            assert_eq!(status(end), want, "{end:?}");
        }
    }
}
