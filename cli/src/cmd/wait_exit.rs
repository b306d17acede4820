//! The exit statuses every `cortex wait` shares, local (`pid|file|flock|log|any`), remote
//! (`--device`) and `cortex wait for`: one place, so the three agree.

pub const FIRED: u8 = 0;
pub const TIMED_OUT: u8 = 1;
pub const BROKE: u8 = 2;
/// Fired, and the job reported failure (`cortex wait for` and remote waits only: a local
/// wait cannot know how the process it watched ended).
pub const FAILED: u8 = 3;
/// A `silent` wake: no signal came for the waitpoint's `silence_after` (`cortex wait for`).
pub const SILENT: u8 = 4;
