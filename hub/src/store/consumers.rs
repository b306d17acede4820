//! Named consumers of a waitpoint's wakes: each name's position (the session event seq of
//! the last wake it took), so a loop of `cortex wait for WP --consumer NAME` sees every wake
//! once, across restarts of the loop and of the hub. A position only moves forward; it is
//! forgotten with its waitpoint.

use super::kernel::error::StoreError;
use super::ops::seconds_of;
use super::tables::{CONSUMERS, STATE, Tx, WAITPOINTS};

impl Tx<'_> {
    /// `name`'s position in waitpoint `wp`'s wakes (0: it has taken none); `None` when the
    /// waitpoint is unknown.
    pub fn consumer_position(&self, wp: &str, name: &str) -> Result<Option<u64>, StoreError> {
        if self.table(&WAITPOINTS).get((wp, STATE))?.is_none() {
            return Ok(None);
        }
        Ok(Some(
            self.table(&CONSUMERS)
                .get((wp, name))?
                .map_or(0, |v| v.value()),
        ))
    }

    /// Moves `name`'s position to `after`, never back: returns where it stands now, or
    /// `None` when the waitpoint is unknown.
    pub fn advance_consumer(
        &mut self,
        wp: &str,
        name: &str,
        after: u64,
    ) -> Result<Option<u64>, StoreError> {
        let Some(now) = self.consumer_position(wp, name)? else {
            return Ok(None);
        };
        if after <= now {
            return Ok(Some(now));
        }
        self.table_mut(&CONSUMERS).insert((wp, name), after)?;
        Ok(Some(after))
    }

    /// Forgets every consumer of `wp` (its purge).
    pub(super) fn forget_consumers(&mut self, wp: &str) -> Result<(), StoreError> {
        for name in seconds_of(&self.table(&CONSUMERS), wp)? {
            self.table_mut(&CONSUMERS).remove((wp, name.as_str()))?;
        }
        Ok(())
    }
}
