//! TokenReview and SubjectAccessReview answers, from rules a test configures.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A user a token authenticates as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUser {
    /// The bearer token.
    pub token: String,
    /// Username.
    pub username: String,
    /// Groups.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// One allow rule of SubjectAccessReview. `*` or an empty list matches anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessRule {
    /// User names (or `*`).
    pub users: Vec<String>,
    /// Verbs.
    #[serde(default)]
    pub verbs: Vec<String>,
    /// API groups.
    #[serde(default)]
    pub api_groups: Vec<String>,
    /// Resources (`pods`, `pods/log`, …).
    #[serde(default)]
    pub resources: Vec<String>,
    /// Namespaces.
    #[serde(default)]
    pub namespaces: Vec<String>,
}

/// The authentication and authorization configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthRules {
    /// Known tokens.
    pub tokens: Vec<TokenUser>,
    /// Allow rules; anything else is denied.
    pub rules: Vec<AccessRule>,
}

/// The token the stand-in's own kubeconfig uses.
pub const ADMIN_TOKEN: &str = "standin-admin-token";
/// Its user.
pub const ADMIN_USER: &str = "standin-admin";
/// Prefix of the tokens TokenRequest issues: `<prefix><namespace>.<account>.<random>`.
pub const SERVICE_ACCOUNT_TOKEN_PREFIX: &str = "standin-sa.";

impl Default for AuthRules {
    fn default() -> Self {
        Self {
            tokens: vec![TokenUser {
                token: ADMIN_TOKEN.into(),
                username: ADMIN_USER.into(),
                groups: vec!["system:masters".into()],
            }],
            rules: vec![AccessRule {
                users: vec![ADMIN_USER.into()],
                verbs: vec![],
                api_groups: vec![],
                resources: vec![],
                namespaces: vec![],
            }],
        }
    }
}

fn matches(list: &[String], value: &str) -> bool {
    list.is_empty() || list.iter().any(|item| item == "*" || item == value)
}

impl AuthRules {
    /// Answers a TokenReview.
    pub fn review_token(&self, review: &Value) -> Value {
        let token = review
            .pointer("/spec/token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let account = token
            .strip_prefix(SERVICE_ACCOUNT_TOKEN_PREFIX)
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(namespace, rest)| rest.split_once('.').map(|(name, _)| (namespace, name)));
        let status = if let Some((namespace, name)) = account {
            json!({"authenticated": true, "user": {
                "username": format!("system:serviceaccount:{namespace}:{name}"),
                "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
            }})
        } else {
            match self.tokens.iter().find(|user| user.token == token) {
                Some(user) => {
                    json!({"authenticated": true, "user": {"username": user.username, "uid": format!("uid-{}", user.username), "groups": user.groups}})
                }
                None => json!({"authenticated": false, "error": "invalid bearer token"}),
            }
        };
        let mut answer = review.clone();
        answer["status"] = status;
        answer
    }

    /// Answers a SubjectAccessReview.
    pub fn review_access(&self, review: &Value) -> Value {
        let spec = review.get("spec").cloned().unwrap_or_default();
        let user = spec.get("user").and_then(Value::as_str).unwrap_or_default();
        let attributes = spec.get("resourceAttributes").cloned().unwrap_or_default();
        let text = |field: &str| {
            attributes
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let resource = match text("subresource").as_str() {
            "" => text("resource"),
            sub => format!("{}/{sub}", text("resource")),
        };
        let allowed = self.rules.iter().any(|rule| {
            matches(&rule.users, user)
                && matches(&rule.verbs, &text("verb"))
                && matches(&rule.api_groups, &text("group"))
                && matches(&rule.resources, &resource)
                && matches(&rule.namespaces, &text("namespace"))
        });
        let mut answer = review.clone();
        answer["status"] = if allowed {
            json!({"allowed": true, "reason": "allowed by a stand-in rule"})
        } else {
            json!({"allowed": false, "reason": format!("no stand-in rule allows {user} to {} {resource}", text("verb"))})
        };
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_access() {
        let mut rules = AuthRules::default();
        rules.rules.push(AccessRule {
            users: vec!["alice".into()],
            verbs: vec!["get".into()],
            api_groups: vec![String::new()],
            resources: vec!["pods/log".into()],
            namespaces: vec!["default".into()],
        });
        let review = rules.review_token(&json!({"spec": {"token": ADMIN_TOKEN}}));
        assert_eq!(review["status"]["user"]["username"], ADMIN_USER);
        assert_eq!(
            rules.review_token(&json!({"spec": {"token": "nope"}}))["status"]["authenticated"],
            false
        );
        let sar = |verb: &str, sub: &str| json!({"spec": {"user": "alice", "resourceAttributes": {"verb": verb, "group": "", "resource": "pods", "subresource": sub, "namespace": "default"}}});
        assert_eq!(
            rules.review_access(&sar("get", "log"))["status"]["allowed"],
            true
        );
        assert_eq!(
            rules.review_access(&sar("get", "exec"))["status"]["allowed"],
            false
        );
        assert_eq!(
            rules.review_access(&sar("delete", "log"))["status"]["allowed"],
            false
        );
    }
}
