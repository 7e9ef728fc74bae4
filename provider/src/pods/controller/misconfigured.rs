//! A creation refused because the daemon is misconfigured (credentials, RAM permissions,
//! clock, account, an endpoint that is not ECI) is not the pod's fault: the pod stays Pending
//! with the service's code and the fix, the node learns of it through the shared
//! [`Monitor`](crate::eci::misconfig::Monitor) (condition and taint), and the pod is created
//! as soon as the configuration is accepted again.

use eci_proto::EciError;
use eci_proto::v20180808::CreateContainerGroupResponse;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::EventType;
use tracing::warn;

use super::{Failure, PodController};
use crate::eci::misconfig::{self, ErrorClass, Misconfiguration};
use crate::pods::from_eci;

/// The action whose answers are judged here.
const CREATE: &str = "CreateContainerGroup";

impl PodController {
    /// What a CreateContainerGroup answer means: the group, or how the pod's creation failed.
    pub(super) fn judge_creation(
        &self,
        outcome: Result<CreateContainerGroupResponse, EciError>,
    ) -> Result<CreateContainerGroupResponse, Failure> {
        self.inner
            .misconfig
            .record(CREATE, outcome.as_ref().map(|_| ()));
        let error = match outcome {
            Ok(response) => return Ok(response),
            Err(error) => error,
        };
        Err(match misconfig::classify(&error) {
            ErrorClass::Configuration(_) => match misconfig::misconfiguration(CREATE, &error) {
                Some(found) => Failure::Misconfigured(found),
                None => Failure::Retry(error.to_string()),
            },
            ErrorClass::Transient => Failure::Retry(error.to_string()),
            ErrorClass::Request => Failure::Permanent(error.to_string()),
        })
    }

    /// Shows the misconfiguration on the pod (Pending, reason and message, an Event): once per
    /// wait, not at every retry.
    pub(super) async fn explain_misconfiguration(&self, pod: &Pod, found: &Misconfiguration) {
        let reason = found.problem.reason();
        let message = format!(
            "{}; the pod stays Pending and is created once ECI accepts the configuration",
            found.describe()
        );
        warn!(code = %found.code, request_id = %found.request_id, "ECI refuses this daemon's configuration; the pod waits");
        self.write_status(pod, |current| {
            Some(from_eci::with_phase(current, "Pending", reason, &message))
        })
        .await;
        self.event(pod, EventType::Warning, reason, &message).await;
    }
}
