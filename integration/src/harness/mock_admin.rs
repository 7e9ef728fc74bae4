//! Reading mock-eci's admin API: end-to-end tests compare what the daemon did with the groups
//! as the fake ECI holds them and with what it received.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::HarnessError;

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
