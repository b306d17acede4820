//! Where cortex keeps its files: `$CORTEX_HOME` (default `~/.cortex`) and the paths under it
//! that the command lines use. Reads the environment only in [`cortex_home`].

use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HomeError {
    #[error(
        "neither CORTEX_HOME nor HOME is set; set CORTEX_HOME to cortex's directory (e.g. ~/.cortex)"
    )]
    NoHome,
}

/// `$CORTEX_HOME`, else `$HOME/.cortex`.
pub fn cortex_home() -> Result<PathBuf, HomeError> {
    resolve(std::env::var_os("CORTEX_HOME"), std::env::var_os("HOME"))
}

/// The rule behind [`cortex_home`], with the two variables passed in. An empty value counts
/// as unset, and a leading `~/` (quoted in a shell, so not expanded) means the home directory.
pub fn resolve(
    cortex_home: Option<OsString>,
    home: Option<OsString>,
) -> Result<PathBuf, HomeError> {
    let home = home.filter(|h| !h.is_empty()).map(PathBuf::from);
    match cortex_home.filter(|c| !c.is_empty()) {
        Some(c) => {
            let c = PathBuf::from(c);
            match (c.strip_prefix("~"), &home) {
                (Ok(rest), Some(home)) => Ok(home.join(rest)),
                _ => Ok(c),
            }
        }
        None => home.map(|h| h.join(".cortex")).ok_or(HomeError::NoHome),
    }
}

/// The spool directory: signals waiting for the hub to collect them.
pub fn spool_dir(home: &std::path::Path) -> PathBuf {
    home.join("tmp").join("signals")
}

/// The operator token file the hub writes when `CORTEX_WEBHOOK_TOKEN` is unset.
pub fn token_file(home: &std::path::Path) -> PathBuf {
    home.join("hub").join("token")
}

/// The file a running hub writes its address to (`http://127.0.0.1:PORT`), beside the
/// token, so a hub on any port (port 0 included) is found without configuration.
pub fn url_file(home: &std::path::Path) -> PathBuf {
    home.join("hub").join("url")
}

/// The address in `$CORTEX_HOME/hub/url`, when a hub wrote one there: its first line,
/// trimmed; `None` for no file, an unreadable one or an empty one.
pub fn hub_url_from_file(home: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(url_file(home)).ok()?;
    let line = text.lines().next()?.trim();
    (!line.is_empty()).then(|| line.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_cortex_home() {
        let some = |s: &str| Some(OsString::from(s));
        assert_eq!(resolve(some("/c"), some("/h")), Ok(PathBuf::from("/c")));
        assert_eq!(resolve(None, some("/h")), Ok(PathBuf::from("/h/.cortex")));
        assert_eq!(
            resolve(some(""), some("/h")),
            Ok(PathBuf::from("/h/.cortex"))
        );
        assert_eq!(resolve(some("~/x"), some("/h")), Ok(PathBuf::from("/h/x")));
        assert_eq!(resolve(None, None), Err(HomeError::NoHome));
        assert_eq!(
            spool_dir(&PathBuf::from("/c")),
            PathBuf::from("/c/tmp/signals")
        );
        assert_eq!(
            token_file(&PathBuf::from("/c")),
            PathBuf::from("/c/hub/token")
        );
    }
}
