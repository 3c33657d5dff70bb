//! A build without the `schema` feature: no validator can be made (the config check refuses
//! `[[schema]]`, and `lib.rs` starts none), so the broker core and the front never hold one.
//! The types keep their callers' code the same in both builds; being uninhabited, none of their
//! methods can run.

use shared::proto::SchemaRef;
use shared::proto::columns::{Shaper, Shapes};

use super::Verdict;

/// No value of this type exists in a build without the feature.
#[derive(Debug)]
pub enum Validator {}

impl Validator {
    pub(crate) fn subjects(&self) -> Vec<String> {
        match *self {}
    }

    pub(crate) fn is_empty(&self) -> bool {
        match *self {}
    }

    pub fn check(&self, _topic: &str, _payload: &[u8]) -> Verdict {
        match *self {}
    }

    pub(crate) fn judge(&self, _topic: &str, _payload: &[u8]) -> Option<Judged> {
        match *self {}
    }

    pub(crate) fn settle_ahead(&self, _judged: Judged) -> Verdict {
        match *self {}
    }
}

impl Shapes for Validator {
    fn cut<'p>(&self, _schema: &SchemaRef, _payload: &'p [u8], _out: &mut Shaper<'p>) -> bool {
        match *self {}
    }
}

/// No value of this type exists in a build without the feature.
#[derive(Debug)]
pub enum Judged {}

impl Judged {
    pub(crate) fn is_of(&self, _topic: &str, _payload: &[u8]) -> bool {
        match *self {}
    }
}
