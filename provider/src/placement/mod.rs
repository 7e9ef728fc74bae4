//! ResourcePolicy placement (ACK-compatible `scheduling.alibabacloud.com/v1alpha1`): pods go
//! to the first unit (node pool, then ECI) with room, capped per unit, and leave in reverse
//! order on scale-in. The policy types and the decisions are pure (`policy`, `decide`); the
//! `index` is fed by watches; the elected replica serves the scheduler `extender` and runs the
//! `controller` (status counts, deletion costs); every replica answers the admission side
//! (`admit`) for the webhook. May call `k8s`, `ops`, `config`.

pub mod admit;
pub mod decide;
pub mod extender;
pub mod index;
pub mod policy;
