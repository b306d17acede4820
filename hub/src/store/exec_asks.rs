//! Commands to start on a device whose link another hub holds (a shared store): the
//! asking hub writes an ask, keyed by its exec id and naming the hub holding the link;
//! that hub takes it, starts it over its link and writes the answer into the ask; the
//! asking hub reads the answer and removes the ask. Each step raises a notice, which the
//! store's bus carries between hubs (the holder also looks every second). The request
//! may carry a secret in its environment: what is stored here is opaque, sealed by the
//! caller (`mesh::exec`).

use serde::{Deserialize, Serialize};

use super::kernel::error::StoreError;
use super::tables::{EXEC_ASKS, Tx, decode, encode};

/// Raised, keyed by the holder's name, when an ask for it is written.
pub const TOPIC_EXEC_ASK: &str = "exec-ask";
/// Raised, keyed by the exec id, when an ask is answered.
pub const TOPIC_EXEC_ANSWER: &str = "exec-answer";

/// An ask nobody answered or removed for this long (its asker died) is dropped.
pub const ASK_KEPT_MS: u64 = 10 * 60 * 1000;

/// One ask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecAsk {
    pub device: String,
    /// The hub holding the device's link when asked: the one to start it.
    pub holder: String,
    /// The request, sealed.
    pub request: Vec<u8>,
    pub asked_at: u64,
    /// The holder took it (it is starting, or started).
    pub taken: bool,
    /// What came of it (encoded by the caller), once answered.
    pub answer: Option<Vec<u8>>,
}

impl Tx<'_> {
    fn exec_ask(&self, exec_id: &str) -> Result<Option<ExecAsk>, StoreError> {
        match self.table(&EXEC_ASKS).get(exec_id)? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    fn put_exec_ask(&mut self, exec_id: &str, ask: &ExecAsk) -> Result<(), StoreError> {
        self.table_mut(&EXEC_ASKS)
            .insert(exec_id, encode(ask)?.as_slice())?;
        Ok(())
    }

    /// Writes an ask (replacing one of the same id: asked again) and tells its holder.
    pub fn ask_exec(&mut self, exec_id: &str, ask: &ExecAsk) -> Result<(), StoreError> {
        self.put_exec_ask(exec_id, ask)?;
        self.notify(TOPIC_EXEC_ASK, &ask.holder, ask.asked_at);
        Ok(())
    }

    /// Whether asks for `holder` wait to be taken.
    pub fn exec_asks_waiting(&self, holder: &str) -> Result<bool, StoreError> {
        for r in self.table(&EXEC_ASKS).iter()? {
            let ask: ExecAsk = decode(r?.1.value())?;
            if ask.holder == holder && !ask.taken {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Takes every ask for `holder` not taken yet (each once: it is marked taken in this
    /// write), and drops the asks nobody came back for in [`ASK_KEPT_MS`].
    pub fn take_exec_asks(
        &mut self,
        holder: &str,
        now: u64,
    ) -> Result<Vec<(String, ExecAsk)>, StoreError> {
        let (mut taken, mut stale) = (Vec::new(), Vec::new());
        for r in self.table(&EXEC_ASKS).iter()? {
            let (k, v) = r?;
            let ask: ExecAsk = decode(v.value())?;
            if ask.asked_at.saturating_add(ASK_KEPT_MS) < now {
                stale.push(k.value().to_string());
            } else if ask.holder == holder && !ask.taken {
                taken.push((k.value().to_string(), ask));
            }
        }
        for id in stale {
            self.table_mut(&EXEC_ASKS).remove(id.as_str())?;
        }
        for (id, ask) in &mut taken {
            ask.taken = true;
            self.put_exec_ask(id, ask)?;
        }
        Ok(taken)
    }

    /// Records what came of an ask and tells its asker; an ask removed meanwhile (its
    /// asker gave up) is left removed.
    pub fn answer_exec_ask(&mut self, exec_id: &str, answer: Vec<u8>) -> Result<(), StoreError> {
        if let Some(mut ask) = self.exec_ask(exec_id)? {
            ask.answer = Some(answer);
            self.put_exec_ask(exec_id, &ask)?;
            self.notify(TOPIC_EXEC_ANSWER, exec_id, u64::from(ask.taken));
        }
        Ok(())
    }

    /// The answer of an ask, once there is one.
    pub fn exec_answer(&self, exec_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.exec_ask(exec_id)?.and_then(|a| a.answer))
    }

    /// Removes an ask (answered, or given up on); its answer, if it had one.
    pub fn forget_exec_ask(&mut self, exec_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let ask = self.exec_ask(exec_id)?;
        if ask.is_some() {
            self.table_mut(&EXEC_ASKS).remove(exec_id)?;
        }
        Ok(ask.and_then(|a| a.answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(holder: &str, at: u64) -> ExecAsk {
        ExecAsk {
            device: "gpu1".into(),
            holder: holder.into(),
            request: b"sealed".to_vec(),
            asked_at: at,
            taken: false,
            answer: None,
        }
    }

    #[tokio::test]
    async fn an_ask_is_taken_once_by_its_holder_answered_and_forgotten() {
        let dir = tempfile::tempdir().expect("dir");
        let (store, _guard) = crate::store::tests::open(dir.path());
        let r = store
            .exec(|t| {
                t.ask_exec("ex_1", &ask("a", 1000))?;
                t.ask_exec("ex_2", &ask("b", 1000))?;
                // Nobody came back for this one in time: dropped by the next take.
                t.ask_exec("ex_old", &ask("a", 1))?;
                let waiting = (t.exec_asks_waiting("a")?, t.exec_asks_waiting("c")?);
                let first: Vec<String> = t
                    .take_exec_asks("a", 2000 + ASK_KEPT_MS - 1500)?
                    .into_iter()
                    .map(|(id, _)| id)
                    .collect();
                let again = t.take_exec_asks("a", 2000)?.len();
                let before = t.exec_answer("ex_1")?;
                t.answer_exec_ask("ex_1", b"started".to_vec())?;
                let after = t.exec_answer("ex_1")?;
                let forgot = t.forget_exec_ask("ex_1")?;
                // An answer for an ask its asker removed is not kept.
                t.answer_exec_ask("ex_1", b"late".to_vec())?;
                let gone = (t.exec_answer("ex_1")?, t.forget_exec_ask("ex_old")?);
                Ok((waiting, first, again, before, after, forgot, gone))
            })
            .await
            .expect("exec");
        let (waiting, first, again, before, after, forgot, gone) = r;
        assert_eq!(waiting, (true, false));
        assert_eq!(first, vec!["ex_1".to_string()], "b's ask is b's");
        assert_eq!(again, 0, "taken once");
        assert_eq!(before, None);
        assert_eq!(after.as_deref(), Some(&b"started"[..]));
        assert_eq!(forgot.as_deref(), Some(&b"started"[..]));
        assert_eq!(gone, (None, None));
    }
}
