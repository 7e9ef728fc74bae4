//! Reading mock-eci's admin API: end-to-end tests compare what the daemon did with the groups
//! as the fake ECI holds them and with what it received.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::HarnessError;

/// The value of tag `key` on `group` (as [`groups`] shows it); empty without that tag.
pub fn tag<'a>(group: &'a Value, key: &str) -> &'a str {
    group["tags"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["key"] == key)
        .and_then(|t| t["value"].as_str())
        .unwrap_or_default()
}

/// Every container group mock-eci at `admin` (`http://HOST:PORT`) holds, deleted ones included,
/// as its admin API shows them.
pub async fn groups(admin: &str) -> Result<Vec<Value>, HarnessError> {
    get_json(format!("{admin}/admin/groups")).await
}

/// What group `id` was created with, as mock-eci received it (parameters such as `HostName`,
/// `DnsPolicy` and the sysctls are in no Describe answer).
pub async fn created_with(admin: &str, id: &str) -> Result<Value, HarnessError> {
    get_json(format!("{admin}/admin/groups/{id}/request")).await
}

async fn get_json<T: DeserializeOwned>(url: String) -> Result<T, HarnessError> {
    let read = async {
        reqwest::get(&url)
            .await?
            .error_for_status()?
            .json::<T>()
            .await
    };
    read.await
        .map_err(|source| HarnessError::MockAdmin { url, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tag_is_read_by_key_and_empty_when_absent() {
        let group = json!({"tags": [
            {"key": "k8s.aliyun.com/pod-uid", "value": "u1"},
            {"key": "k8s.aliyun.com/node", "value": "virtual-node-eci-0"},
        ]});
        assert_eq!(tag(&group, "k8s.aliyun.com/node"), "virtual-node-eci-0");
        assert_eq!(tag(&group, "k8s.aliyun.com/pod-uid"), "u1");
        assert_eq!(tag(&group, "absent"), "");
        assert_eq!(tag(&json!({}), "k8s.aliyun.com/node"), "");
    }
}
