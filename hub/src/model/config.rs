//! Where the model is, which server it is and how patiently to talk to it:
//! [`ModelConfig`] and [`llm_config`], which reads it from settings.json's `llm` object
//! and the `CORTEX_LLM_*` environment.

use std::time::Duration;

use serde_json::Value;

use super::caps::Endpoint;
use super::error::ModelError;

/// An OpenAI-compatible endpoint and the client's timeouts and retries.
#[derive(Clone, PartialEq)]
pub struct ModelConfig {
    /// The API's base, e.g. `http://127.0.0.1:11434/v1`; requests go to
    /// `{base_url}/chat/completions`.
    pub base_url: String,
    pub model: String,
    /// Which server it is, for what it can enforce.
    pub endpoint: Endpoint,
    /// Sent as `Authorization: Bearer`; never logged, never shown by `Debug`.
    pub api_key: Option<String>,
    pub connect_timeout: Duration,
    /// From sending the request to the response's head and first chunk.
    pub first_byte_timeout: Duration,
    /// The longest silence between two chunks of an answer.
    pub idle_timeout: Duration,
    /// Calls made again after the first fails with a passing trouble.
    pub max_retries: u32,
    /// The first retry's delay before jitter; it doubles each retry, capped at 30 s.
    pub backoff: Duration,
    /// The model's context in tokens, as set (`llm.contextTokens`,
    /// `CORTEX_LLM_CONTEXT_TOKENS`); the server's own figure is asked for too, and the
    /// smaller is used.
    pub context_tokens: Option<u64>,
    /// The most bytes one reply may stream (its text, reasoning and tool calls; the
    /// stream itself, envelopes and comments included, may be [`RAW_BYTES_PER_REPLY_BYTE`]
    /// times that): settings.json `limits.replyBytes`.
    pub reply_bytes: u64,
    /// The longest one call may take, its retries and their waits included:
    /// settings.json `limits.callDeadlineMs`.
    pub call_deadline: Duration,
}

/// How many bytes of stream (chunk envelopes, `: ping` comments, whitespace) one byte of
/// reply may cost: a real server's envelope around a token is a few hundred bytes, so a
/// reply of many small tokens is not cut, yet a stream of nothing but pings is.
pub const RAW_BYTES_PER_REPLY_BYTE: u64 = 16;

impl ModelConfig {
    /// An endpoint with the default timeouts and retries, its server told from the base
    /// URL's host ([`Endpoint::from_base_url`]).
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        let base_url = base_url.into();
        ModelConfig {
            endpoint: Endpoint::from_base_url(&base_url),
            base_url,
            model: model.into(),
            api_key: None,
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(60),
            max_retries: 4,
            backoff: Duration::from_millis(500),
            context_tokens: None,
            reply_bytes: crate::config::Limits::default().reply_bytes,
            call_deadline: Duration::from_millis(crate::config::Limits::default().call_deadline_ms),
        }
    }

    /// These bounds from settings.json `limits`.
    pub fn with_limits(mut self, limits: &crate::config::Limits) -> Self {
        self.reply_bytes = limits.reply_bytes;
        self.call_deadline = Duration::from_millis(limits.call_deadline_ms);
        self
    }
}

impl std::fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("connect_timeout", &self.connect_timeout)
            .field("first_byte_timeout", &self.first_byte_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff", &self.backoff)
            .field("context_tokens", &self.context_tokens)
            .field("reply_bytes", &self.reply_bytes)
            .field("call_deadline", &self.call_deadline)
            .finish()
    }
}

/// The keys settings.json's `llm` object may hold.
const KEYS: &[&str] = &[
    "baseUrl",
    "model",
    "endpoint",
    "apiKeyEnv",
    "connectTimeoutMs",
    "firstByteTimeoutMs",
    "idleTimeoutMs",
    "maxRetries",
    "backoffMs",
    "contextTokens",
];

/// The model the hub's runner calls, from settings.json's `llm` object
/// (`{baseUrl, model, endpoint, apiKeyEnv, connectTimeoutMs, firstByteTimeoutMs,
/// idleTimeoutMs, maxRetries, backoffMs, contextTokens}`, all optional) and the
/// environment (`CORTEX_LLM_BASE_URL`, `CORTEX_LLM_MODEL`, `CORTEX_LLM_ENDPOINT`,
/// `CORTEX_LLM_API_KEY`, `CORTEX_LLM_CONTEXT_TOKENS`).
///
/// As with the hub's other settings, a key in settings.json wins and the environment
/// fills what it leaves out. The API key is never in the file: `apiKeyEnv` names the
/// variable that holds it (which must then be set), else `CORTEX_LLM_API_KEY` is read
/// (and may be absent: local servers need none). Empty values count as absent.
///
/// `endpoint` names the server (`openai`, `vllm`, `ollama`, `llamacpp`, `groq`, `other`)
/// for what it can enforce; unset, it is told from the base URL's host
/// ([`Endpoint::from_base_url`]).
///
/// `Ok(None)` when no base URL is set: the hub then runs no turns. A base URL without a
/// model, a URL that is not `http://` or `https://`, an unknown key or a bad number is
/// an error that says which.
pub fn llm_config(
    settings_llm: Option<&Value>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<ModelConfig>, ModelError> {
    let empty = serde_json::Map::new();
    let llm = match settings_llm {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(ModelError::Config(format!(
                "settings.json llm must be an object like {{\"baseUrl\": …, \"model\": …}}, not {other}"
            )));
        }
    };
    if let Some(k) = llm.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(ModelError::Config(format!(
            "settings.json llm.{k} is not a setting; the settings are {}",
            KEYS.join(", ")
        )));
    }
    let text = |key: &str, var: &str| -> Result<Option<String>, ModelError> {
        match llm.get(key) {
            None | Some(Value::Null) => Ok(env(var)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())),
            Some(Value::String(s)) => Ok(Some(s.trim().to_string()).filter(|v| !v.is_empty())),
            Some(other) => Err(ModelError::Config(format!(
                "settings.json llm.{key} must be a string, not {other}"
            ))),
        }
    };
    let Some(base_url) = text("baseUrl", "CORTEX_LLM_BASE_URL")? else {
        return Ok(None);
    };
    let base_url = base_url_of(&base_url)?;
    let Some(model) = text("model", "CORTEX_LLM_MODEL")? else {
        return Err(ModelError::Config(format!(
            "a model server is set ({}) but no model: set CORTEX_LLM_MODEL or settings.json llm.model",
            without_query(&base_url)
        )));
    };
    let api_key = match llm.get("apiKeyEnv") {
        None | Some(Value::Null) => env("CORTEX_LLM_API_KEY"),
        Some(Value::String(var)) if !var.trim().is_empty() => {
            let var = var.trim();
            let key = env(var).filter(|k| !k.trim().is_empty());
            if key.is_none() {
                return Err(ModelError::Config(format!(
                    "settings.json llm.apiKeyEnv names {var}, which is not set in the hub's environment"
                )));
            }
            key
        }
        Some(other) => {
            return Err(ModelError::Config(format!(
                "settings.json llm.apiKeyEnv must name an environment variable, not {other}"
            )));
        }
    }
    .map(|k| k.trim().to_string())
    .filter(|k| !k.is_empty());
    let mut cfg = ModelConfig::new(base_url, model);
    cfg.api_key = api_key;
    if let Some(word) = text("endpoint", "CORTEX_LLM_ENDPOINT")? {
        cfg.endpoint = Endpoint::from_word(&word).ok_or_else(|| {
            let from = match llm.get("endpoint") {
                None | Some(Value::Null) => "CORTEX_LLM_ENDPOINT",
                Some(_) => "settings.json llm.endpoint",
            };
            let words: Vec<&str> = Endpoint::ALL.iter().map(|e| e.as_str()).collect();
            ModelError::Config(format!(
                "{from} is {word:?}, which is not a server the hub knows; it is one of {}",
                words.join(", ")
            ))
        })?;
    }
    let ms = |key: &str, default: Duration| -> Result<Duration, ModelError> {
        match llm.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Duration::from_millis(n)),
                _ => Err(ModelError::Config(format!(
                    "settings.json llm.{key} must be a whole number of milliseconds above 0, not {v}"
                ))),
            },
        }
    };
    cfg.connect_timeout = ms("connectTimeoutMs", cfg.connect_timeout)?;
    cfg.first_byte_timeout = ms("firstByteTimeoutMs", cfg.first_byte_timeout)?;
    cfg.idle_timeout = ms("idleTimeoutMs", cfg.idle_timeout)?;
    cfg.backoff = ms("backoffMs", cfg.backoff)?;
    if let Some(v) = llm.get("maxRetries").filter(|v| !v.is_null()) {
        cfg.max_retries = v
            .as_u64()
            .filter(|&n| n <= 20)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                ModelError::Config(format!(
                    "settings.json llm.maxRetries must be a whole number from 0 to 20, not {v}"
                ))
            })?;
    }
    cfg.context_tokens = match llm.get("contextTokens").filter(|v| !v.is_null()) {
        Some(v) => Some(v.as_u64().filter(|&n| n >= 256).ok_or_else(|| {
            ModelError::Config(format!(
                "settings.json llm.contextTokens must be a whole number of tokens, at least 256, not {v}"
            ))
        })?),
        None => match env("CORTEX_LLM_CONTEXT_TOKENS").map(|v| v.trim().to_string()) {
            Some(v) if !v.is_empty() => Some(v.parse::<u64>().ok().filter(|&n| n >= 256).ok_or_else(
                || {
                    ModelError::Config(format!(
                        "CORTEX_LLM_CONTEXT_TOKENS={v:?} must be a whole number of tokens, at least 256"
                    ))
                },
            )?),
            _ => None,
        },
    };
    Ok(Some(cfg))
}

/// `url` up to its query.
fn without_query(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or_default()
}

/// A base URL as the client wants it: `http(s)://…`, without a trailing `/` or a pasted
/// `/chat/completions`.
pub fn base_url_of(url: &str) -> Result<String, ModelError> {
    let url = url.trim();
    let (url, query) = match url.split_once('?') {
        Some((u, q)) => (u, Some(q)),
        None => (url, None),
    };
    let url = url.trim_end_matches('/');
    let url = url.strip_suffix("/chat/completions").unwrap_or(url);
    let url = match query {
        Some(q) => format!("{url}?{q}"),
        None => url.to_string(),
    };
    let url = url.as_str();
    // Errors show the URL without its query, which may hold a key.
    let shown = without_query(url);
    let parsed = reqwest::Url::parse(url).map_err(|e| {
        ModelError::Config(format!(
            "the model server's base URL {shown:?} is not a URL ({e}); it looks like http://127.0.0.1:11434/v1"
        ))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(ModelError::Config(format!(
            "the model server's base URL {shown:?} must start with http:// or https://"
        )));
    }
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    fn err(r: Result<Option<ModelConfig>, ModelError>) -> String {
        match r {
            Err(ModelError::Config(m)) => m,
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn nothing_set_means_no_model() {
        assert_eq!(llm_config(None, &env_of(&[])).expect("ok"), None);
        assert_eq!(
            llm_config(Some(&json!(null)), &env_of(&[])).expect("ok"),
            None
        );
        assert_eq!(
            llm_config(Some(&json!({})), &env_of(&[("CORTEX_LLM_BASE_URL", " ")])).expect("ok"),
            None
        );
        // A model alone is not enough to call anything.
        assert_eq!(
            llm_config(None, &env_of(&[("CORTEX_LLM_MODEL", "m")])).expect("ok"),
            None
        );
    }

    #[test]
    fn from_the_environment_with_the_defaults() {
        let env = env_of(&[
            ("CORTEX_LLM_BASE_URL", "http://127.0.0.1:11434/v1/"),
            ("CORTEX_LLM_MODEL", "qwen3:8b"),
            ("CORTEX_LLM_API_KEY", "sk-test"),
        ]);
        let cfg = llm_config(None, &env).expect("ok").expect("some");
        assert_eq!(cfg.base_url, "http://127.0.0.1:11434/v1");
        assert_eq!(cfg.model, "qwen3:8b");
        assert_eq!(cfg.api_key.as_deref(), Some("sk-test"));
        assert_eq!(cfg.connect_timeout, Duration::from_secs(10));
        assert_eq!(cfg.first_byte_timeout, Duration::from_secs(120));
        assert_eq!(cfg.idle_timeout, Duration::from_secs(60));
        assert_eq!(cfg.max_retries, 4);
        assert_eq!(cfg.backoff, Duration::from_millis(500));
    }

    #[test]
    fn settings_win_and_the_environment_fills_the_gaps() {
        let env = env_of(&[
            ("CORTEX_LLM_BASE_URL", "http://env:1/v1"),
            ("CORTEX_LLM_MODEL", "env-model"),
            ("CORTEX_LLM_API_KEY", "env-key"),
            ("MY_KEY", "file-named-key"),
        ]);
        let llm = json!({"baseUrl": "https://api.example.com/v1", "apiKeyEnv": "MY_KEY",
            "connectTimeoutMs": 2000, "firstByteTimeoutMs": 3000, "idleTimeoutMs": 4000,
            "maxRetries": 0, "backoffMs": 50});
        let cfg = llm_config(Some(&llm), &env).expect("ok").expect("some");
        assert_eq!(cfg.base_url, "https://api.example.com/v1");
        assert_eq!(cfg.model, "env-model");
        assert_eq!(cfg.api_key.as_deref(), Some("file-named-key"));
        assert_eq!(cfg.connect_timeout, Duration::from_secs(2));
        assert_eq!(cfg.first_byte_timeout, Duration::from_secs(3));
        assert_eq!(cfg.idle_timeout, Duration::from_secs(4));
        assert_eq!(cfg.max_retries, 0);
        assert_eq!(cfg.backoff, Duration::from_millis(50));
    }

    #[test]
    fn a_pasted_endpoint_is_taken_as_its_base() {
        let llm = json!({"baseUrl": "http://h:8000/v1/chat/completions", "model": "m"});
        let cfg = llm_config(Some(&llm), &env_of(&[]))
            .expect("ok")
            .expect("some");
        assert_eq!(cfg.base_url, "http://h:8000/v1");
        assert_eq!(cfg.api_key, None);
    }

    #[test]
    fn a_query_on_the_base_stays_and_is_never_shown() {
        let llm = json!({"baseUrl": "https://x.example/openai/deployments/d/chat/completions/?api-version=2024-10-21", "model": "m"});
        let cfg = llm_config(Some(&llm), &env_of(&[]))
            .expect("ok")
            .expect("some");
        assert_eq!(
            cfg.base_url,
            "https://x.example/openai/deployments/d?api-version=2024-10-21"
        );
        let no_model = err(llm_config(
            None,
            &env_of(&[("CORTEX_LLM_BASE_URL", "http://h/v1?key=zzz")]),
        ));
        assert!(!no_model.contains("zzz"), "{no_model}");
        let bad = err(llm_config(
            None,
            &env_of(&[
                ("CORTEX_LLM_BASE_URL", "h/v1?key=zzz"),
                ("CORTEX_LLM_MODEL", "m"),
            ]),
        ));
        assert!(!bad.contains("zzz"), "{bad}");
    }

    #[test]
    fn mistakes_are_named() {
        let no_model = err(llm_config(
            None,
            &env_of(&[("CORTEX_LLM_BASE_URL", "http://h/v1")]),
        ));
        assert!(
            no_model.contains("no model") && no_model.contains("CORTEX_LLM_MODEL"),
            "{no_model}"
        );
        let unset_key = err(llm_config(
            Some(&json!({"baseUrl": "http://h/v1", "model": "m", "apiKeyEnv": "NOPE"})),
            &env_of(&[]),
        ));
        assert!(
            unset_key.contains("NOPE") && unset_key.contains("not set"),
            "{unset_key}"
        );
        let typo = err(llm_config(
            Some(&json!({"baseURL": "http://h/v1"})),
            &env_of(&[]),
        ));
        assert!(typo.contains("llm.baseURL is not a setting"), "{typo}");
        let scheme = err(llm_config(
            Some(&json!({"baseUrl": "ftp://h/v1", "model": "m"})),
            &env_of(&[]),
        ));
        assert!(scheme.contains("http://"), "{scheme}");
        let not_url = err(llm_config(
            None,
            &env_of(&[
                ("CORTEX_LLM_BASE_URL", "localhost:11434"),
                ("CORTEX_LLM_MODEL", "m"),
            ]),
        ));
        assert!(not_url.contains("base URL"), "{not_url}");
        let zero = err(llm_config(
            Some(&json!({"baseUrl": "http://h/v1", "model": "m", "idleTimeoutMs": 0})),
            &env_of(&[]),
        ));
        assert!(zero.contains("llm.idleTimeoutMs"), "{zero}");
        let many = err(llm_config(
            Some(&json!({"baseUrl": "http://h/v1", "model": "m", "maxRetries": 1000})),
            &env_of(&[]),
        ));
        assert!(many.contains("llm.maxRetries"), "{many}");
        let shape = err(llm_config(Some(&json!("http://h/v1")), &env_of(&[])));
        assert!(shape.contains("must be an object"), "{shape}");
        let number = err(llm_config(Some(&json!({"baseUrl": 7})), &env_of(&[])));
        assert!(number.contains("llm.baseUrl must be a string"), "{number}");
    }

    #[test]
    fn the_endpoint_is_named_or_told_from_the_host() {
        use Endpoint::*;
        // (settings.json llm.endpoint, CORTEX_LLM_ENDPOINT, base URL, the endpoint)
        let cases: [(Option<Value>, Option<&str>, &str, Endpoint); 12] = [
            (None, None, "http://127.0.0.1:8080/v1", Other),
            (None, None, "https://api.openai.com/v1", OpenAi),
            (None, None, "https://api.groq.com/openai/v1", Groq),
            (None, Some("llamacpp"), "http://127.0.0.1:8080/v1", LlamaCpp),
            (Some(json!("vllm")), None, "http://gpu:8000/v1", Vllm),
            (Some(json!("Ollama")), None, "http://h:11434/v1", Ollama),
            // Settings win over the environment, and a named endpoint over the host.
            (Some(json!("vllm")), Some("ollama"), "http://h/v1", Vllm),
            (None, Some("other"), "https://api.openai.com/v1", Other),
            (Some(json!("groq")), None, "https://api.openai.com/v1", Groq),
            // Empty is unset: the environment, then the host.
            (Some(json!(" ")), Some("ollama"), "http://h/v1", Other),
            (Some(json!(null)), Some("openai"), "http://h/v1", OpenAi),
            (None, Some(""), "https://api.groq.com/openai/v1", Groq),
        ];
        for (setting, var, url, want) in cases {
            let cfg = with_endpoint(setting.as_ref(), var, url)
                .expect("ok")
                .expect("some");
            assert_eq!(cfg.endpoint, want, "{setting:?} {var:?} {url}");
        }
        assert_eq!(
            ModelConfig::new("https://api.openai.com/v1", "m").endpoint,
            OpenAi
        );
    }

    /// The config read with settings.json `llm.endpoint` = `setting` and
    /// `CORTEX_LLM_ENDPOINT` = `var` (each when given) for a server at `url`.
    fn with_endpoint(
        setting: Option<&Value>,
        var: Option<&str>,
        url: &str,
    ) -> Result<Option<ModelConfig>, ModelError> {
        let mut llm = json!({"baseUrl": url, "model": "m"});
        if let Some(s) = setting {
            llm["endpoint"] = s.clone();
        }
        let pairs: Vec<(&str, &str)> = var
            .map(|v| ("CORTEX_LLM_ENDPOINT", v))
            .into_iter()
            .collect();
        llm_config(Some(&llm), &env_of(&pairs))
    }

    #[test]
    fn an_unknown_endpoint_is_named_with_the_words() {
        // (settings.json llm.endpoint, CORTEX_LLM_ENDPOINT, where the error says it came from)
        let cases = [
            (Some(json!("llama.cpp")), None, "settings.json llm.endpoint"),
            (None, Some("azure"), "CORTEX_LLM_ENDPOINT"),
            (
                Some(json!("nope")),
                Some("vllm"),
                "settings.json llm.endpoint",
            ),
        ];
        for (setting, var, from) in cases {
            let m = err(with_endpoint(setting.as_ref(), var, "http://h/v1"));
            assert!(m.starts_with(from), "{m}");
            assert!(
                m.contains("openai, vllm, ollama, llamacpp, groq, other"),
                "{m}"
            );
        }
        let number = err(llm_config(
            Some(&json!({"baseUrl": "http://h/v1", "model": "m", "endpoint": 3})),
            &env_of(&[]),
        ));
        assert!(number.contains("llm.endpoint must be a string"), "{number}");
    }

    #[test]
    fn the_context_is_set_in_settings_or_the_environment() {
        let base = json!({"baseUrl": "http://h/v1", "model": "m"});
        // (settings.json llm.contextTokens, CORTEX_LLM_CONTEXT_TOKENS, the setting or the error's words)
        type Case<'a> = (Option<Value>, Option<&'a str>, Result<Option<u64>, &'a str>);
        let cases: [Case<'_>; 6] = [
            (None, None, Ok(None)),
            (Some(json!(2048)), None, Ok(Some(2048))),
            (None, Some(" 8192 "), Ok(Some(8192))),
            (Some(json!(4096)), Some("8192"), Ok(Some(4096))),
            (Some(json!(100)), None, Err("llm.contextTokens")),
            (None, Some("2k"), Err("CORTEX_LLM_CONTEXT_TOKENS")),
        ];
        for (setting, var, want) in cases {
            let mut llm = base.clone();
            if let Some(s) = &setting {
                llm["contextTokens"] = s.clone();
            }
            let pairs: Vec<(&str, &str)> = var
                .map(|v| ("CORTEX_LLM_CONTEXT_TOKENS", v))
                .into_iter()
                .collect();
            let got = llm_config(Some(&llm), &env_of(&pairs));
            match want {
                Ok(n) => assert_eq!(got.expect("ok").expect("some").context_tokens, n),
                Err(words) => assert!(err(got).contains(words), "{setting:?} {var:?}"),
            }
        }
    }

    #[test]
    fn the_key_never_shows_in_debug() {
        let mut cfg = ModelConfig::new("http://h/v1", "m");
        cfg.api_key = Some("sk-very-secret".into());
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("sk-very-secret"), "{shown}");
        assert!(shown.contains("<set>"), "{shown}");
    }
}
