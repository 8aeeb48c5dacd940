//! Registry credentials and challenges: the user's Docker config (`$DOCKER_CONFIG/config.json`,
//! else `~/.docker/config.json`; `auths` entries with `auth` = base64 `user:password`, or
//! `username`/`password`), and the `WWW-Authenticate` challenge of a registry (`Basic
//! realm=…`, or `Bearer realm=…,service=…,scope=…`: a token from the realm, fetched with the
//! Basic credentials). Credential helpers (`credHelpers`, `credsStore`) are not run: a registry
//! they serve is refused with an error naming the helper. Passwords never appear in `Debug`
//! output or errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// Errors reading credentials.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("reading the Docker config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the Docker config {path} is not JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{path}: the credentials of {registry} are kept by the credential helper `docker-credential-{helper}` ({key}), which this tool does not run; add an `auths` entry for {registry} (e.g. a separate DOCKER_CONFIG with `{{\"auths\": {{\"{registry}\": {{\"auth\": \"<base64 user:password>\"}}}}}}`)"
    )]
    Helper {
        path: PathBuf,
        registry: String,
        helper: String,
        key: &'static str,
    },
    #[error("{path}: auths[{registry}].{field} is not valid: {reason}")]
    Entry {
        path: PathBuf,
        registry: String,
        field: &'static str,
        reason: String,
    },
}

/// A user name and password (or token) for Basic authentication.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// The `Authorization` header value for Basic authentication.
    pub fn basic_header(&self) -> String {
        format!(
            "Basic {}",
            STANDARD.encode(format!("{}:{}", self.username, self.password))
        )
    }
}

/// The user's Docker config file: `$DOCKER_CONFIG/config.json`, else
/// `$HOME/.docker/config.json`.
pub fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker/config.json"))
}

/// The credentials for `registry` (`host[:port]`) in the user's Docker config; `None` when the
/// file or an entry for the registry does not exist (anonymous access).
pub fn docker_credentials(registry: &str) -> Result<Option<Credentials>, AuthError> {
    let Some(path) = docker_config_path() else {
        return Ok(None);
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => credentials_in(&path, &text, registry),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(AuthError::Read { path, source }),
    }
}

/// `https://host:port/v1/` → `host:port` (how `auths` keys are written varies).
fn registry_of_key(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key)
}

/// The credentials for `registry` in the Docker config `text` (read from `path`).
pub fn credentials_in(
    path: &Path,
    text: &str,
    registry: &str,
) -> Result<Option<Credentials>, AuthError> {
    let config: serde_json::Value =
        serde_json::from_str(text).map_err(|source| AuthError::Json {
            path: path.to_path_buf(),
            source,
        })?;
    let helper_error = |helper: &str, key| AuthError::Helper {
        path: path.to_path_buf(),
        registry: registry.to_string(),
        helper: helper.to_string(),
        key,
    };
    let helper = config["credHelpers"].as_object().and_then(|helpers| {
        helpers
            .iter()
            .find(|(key, _)| registry_of_key(key) == registry)
            .and_then(|(_, helper)| helper.as_str())
    });
    if let Some(helper) = helper {
        return Err(helper_error(helper, "credHelpers"));
    }
    let entry = config["auths"].as_object().and_then(|auths| {
        auths
            .iter()
            .find(|(key, _)| registry_of_key(key) == registry)
            .map(|(_, entry)| entry)
    });
    let bad = |field, reason: &str| AuthError::Entry {
        path: path.to_path_buf(),
        registry: registry.to_string(),
        field,
        reason: reason.to_string(),
    };
    if let Some(auth) = entry.and_then(|entry| entry["auth"].as_str()) {
        let decoded = STANDARD
            .decode(auth.trim())
            .map_err(|_| bad("auth", "not base64"))?;
        let decoded = String::from_utf8(decoded).map_err(|_| bad("auth", "not UTF-8"))?;
        let (username, password) = decoded
            .split_once(':')
            .ok_or_else(|| bad("auth", "not base64 of user:password"))?;
        return Ok(Some(Credentials {
            username: username.to_string(),
            password: password.to_string(),
        }));
    }
    let fields = entry.map(|entry| (entry["username"].as_str(), entry["password"].as_str()));
    if let Some((Some(username), Some(password))) = fields {
        return Ok(Some(Credentials {
            username: username.to_string(),
            password: password.to_string(),
        }));
    }
    // An entry without credentials (Docker Desktop writes `{}`) or none at all: with a
    // credsStore the secret is in the store.
    if let Some(store) = config["credsStore"].as_str().filter(|s| !s.is_empty()) {
        return Err(helper_error(store, "credsStore"));
    }
    Ok(None)
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// `basic` or `bearer` (lower case).
    pub scheme: String,
    /// Parameters by lower-case name (`realm`, `service`, `scope`, `error`).
    pub params: BTreeMap<String, String>,
}

impl Challenge {
    /// Parses `Scheme k="v", k2=v2` (quoted values may hold commas and `\"`). Only the first
    /// challenge of a header is read.
    pub fn parse(header: &str) -> Option<Self> {
        let header = header.trim();
        let (scheme, mut rest) = match header.split_once(char::is_whitespace) {
            Some((scheme, rest)) => (scheme, rest.trim_start()),
            None => (header, ""),
        };
        if scheme.is_empty() {
            return None;
        }
        let mut params = BTreeMap::new();
        while !rest.is_empty() {
            let (name, after) = rest.split_once('=')?;
            let name = name
                .trim()
                .trim_start_matches(',')
                .trim()
                .to_ascii_lowercase();
            let after = after.trim_start();
            let (value, remaining) = if let Some(quoted) = after.strip_prefix('"') {
                let mut value = String::new();
                let mut chars = quoted.char_indices();
                let mut end = None;
                while let Some((index, c)) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some((_, escaped)) = chars.next() {
                                value.push(escaped);
                            }
                        }
                        '"' => {
                            end = Some(index + 1);
                            break;
                        }
                        c => value.push(c),
                    }
                }
                (value, &quoted[end?..])
            } else {
                let end = after.find(',').unwrap_or(after.len());
                (after[..end].trim().to_string(), &after[end..])
            };
            if name.is_empty() {
                return None;
            }
            params.insert(name, value);
            rest = remaining.trim_start().trim_start_matches(',').trim_start();
        }
        Some(Self {
            scheme: scheme.to_ascii_lowercase(),
            params,
        })
    }

    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(text: &str, registry: &str) -> Result<Option<Credentials>, AuthError> {
        credentials_in(Path::new("/home/u/.docker/config.json"), text, registry)
    }

    #[test]
    fn docker_config_auth_entries_decode_to_user_and_password() {
        let auth = STANDARD.encode("robot$ci:s3cr:et");
        let text = format!(
            r#"{{"auths": {{
                "https://registry.example.net/v1/": {{"auth": "{auth}"}},
                "127.0.0.1:5000": {{"username": "u", "password": "p"}},
                "other.example.net": {{}}
            }}}}"#
        );
        let found = creds(&text, "registry.example.net")
            .expect("ok")
            .expect("found");
        assert_eq!(found.username, "robot$ci");
        assert_eq!(found.password, "s3cr:et", "only the first colon separates");
        assert_eq!(
            creds(&text, "127.0.0.1:5000").expect("ok"),
            Some(Credentials {
                username: "u".into(),
                password: "p".into()
            })
        );
        assert_eq!(creds(&text, "other.example.net").expect("ok"), None);
        assert_eq!(creds(&text, "ghcr.io").expect("ok"), None);
        assert_eq!(creds("{}", "ghcr.io").expect("ok"), None);
        // Debug never shows the password.
        assert!(!format!("{found:?}").contains("s3cr"));
        assert_eq!(
            Credentials {
                username: "u".into(),
                password: "p".into()
            }
            .basic_header(),
            "Basic dTpw"
        );
    }

    #[test]
    fn credential_helpers_and_bad_entries_are_refused_by_name() {
        let helper = r#"{"auths": {}, "credHelpers": {"registry.example.net": "ecr-login"}}"#;
        let error = creds(helper, "registry.example.net")
            .expect_err("helper")
            .to_string();
        assert!(error.contains("docker-credential-ecr-login"), "{error}");
        assert!(error.contains("credHelpers"), "{error}");
        assert_eq!(creds(helper, "ghcr.io").expect("other registry"), None);
        let store = r#"{"auths": {"ghcr.io": {}}, "credsStore": "desktop"}"#;
        let error = creds(store, "ghcr.io").expect_err("store").to_string();
        assert!(error.contains("docker-credential-desktop"), "{error}");
        let bad = r#"{"auths": {"ghcr.io": {"auth": "not base64!"}}}"#;
        let error = creds(bad, "ghcr.io").expect_err("bad").to_string();
        assert!(error.contains("auths[ghcr.io].auth"), "{error}");
        let no_colon = format!(
            r#"{{"auths": {{"ghcr.io": {{"auth": "{}"}}}}}}"#,
            STANDARD.encode("x")
        );
        assert!(creds(&no_colon, "ghcr.io").is_err());
        assert!(creds("not json", "ghcr.io").is_err());
    }

    #[test]
    fn challenges_parse_with_quoted_commas_and_escapes() {
        let bearer = Challenge::parse(
            r#"Bearer realm="https://auth.example.net/token",service="registry.example.net",scope="repository:tno/tailnet-agent:pull,push""#,
        )
        .expect("bearer");
        assert_eq!(bearer.scheme, "bearer");
        assert_eq!(
            bearer.param("realm"),
            Some("https://auth.example.net/token")
        );
        assert_eq!(bearer.param("service"), Some("registry.example.net"));
        assert_eq!(
            bearer.param("scope"),
            Some("repository:tno/tailnet-agent:pull,push")
        );
        let basic = Challenge::parse(r#"Basic realm="a \"quoted\" realm""#).expect("basic");
        assert_eq!(basic.scheme, "basic");
        assert_eq!(basic.param("realm"), Some(r#"a "quoted" realm"#));
        let spaced = Challenge::parse("bearer  Realm=http://127.0.0.1:1/token , Service=lab")
            .expect("unquoted");
        assert_eq!(spaced.param("realm"), Some("http://127.0.0.1:1/token"));
        assert_eq!(spaced.param("service"), Some("lab"));
        assert_eq!(Challenge::parse("Basic").expect("bare").params.len(), 0);
        assert!(Challenge::parse("").is_none());
        assert!(Challenge::parse(r#"Bearer realm="unterminated"#).is_none());
    }
}
