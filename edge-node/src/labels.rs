//! Metric label sets more than one subsystem uses, and the one safe way to take a labelled
//! metric out of its family. A leaf: subsystems build and register their own metrics with these,
//! and never import another subsystem's metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ListenerLabel {
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RefusedLabels {
    pub listener: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClassLabel {
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    pub reason: &'static str,
}

/// The metric for `label`, cloned out of its family. `get_or_create` returns a read guard: held
/// across a second call on the same family (as temporaries in one expression are), a create
/// there needs the write lock and deadlocks. Going through this function drops it at once.
pub(crate) fn handle<L, M>(family: &Family<L, M>, label: &L) -> M
where
    L: Clone + std::hash::Hash + Eq,
    M: Clone + Default,
{
    family.get_or_create(label).clone()
}

pub(crate) fn listener_label(name: &str) -> ListenerLabel {
    ListenerLabel { listener: name.to_owned() }
}

pub(crate) fn class_label(class: &str) -> ClassLabel {
    ClassLabel { class: class.to_owned() }
}

pub(crate) fn reason(reason: &'static str) -> ReasonLabel {
    ReasonLabel { reason }
}
