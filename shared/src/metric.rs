//! One way to define a subsystem's metrics: [`metrics!`](crate::metrics) declares the struct,
//! its `Default` and its `register`, each field once with its name, help, unit and first
//! value, so a field cannot be added and left out of the registry, nor registered under the
//! help of another.
//!
//! ```text
//! shared::metrics! {
//!     /// What a subsystem counts.
//!     #[derive(Debug)]
//!     pub struct Counts {
//!         pub sent: Counter => ("sent", "Messages sent"),
//!         pub latency: Histogram => ("latency", "From send to ack", unit Seconds, init Histogram::new(..)),
//!         pub probes: ProbeCounts => (nested),
//!         pub up: Gauge => (not exported, init gauge_at_one()),
//!     }
//! }
//! ```
//!
//! A field is one of: `("name", "help")`, optionally followed by `unit Seconds` (any
//! `prometheus_client::registry::Unit` variant) and `init EXPR` (its first value; else its
//! type's `Default`); `(nested)`, a struct of its own that registers itself; or
//! `(not exported)`, kept beside the metrics and never registered, with an optional `init`.

pub use prometheus_client::registry::{Registry, Unit};

#[macro_export]
macro_rules! metrics {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $ty:ty => ( $($how:tt)* ) ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $ty, )*
        }

        impl ::core::default::Default for $name {
            fn default() -> Self {
                Self { $( $field: $crate::metrics!(@init $ty; $($how)*), )* }
            }
        }

        impl $name {
            /// Registers every exported field in `registry`.
            pub fn register(&self, registry: &mut $crate::metric::Registry) {
                $( $crate::metrics!(@register registry, self.$field; $($how)*); )*
            }
        }
    };
    (@init $ty:ty; $n:literal, $h:literal $(, unit $u:ident)?) => { <$ty as ::core::default::Default>::default() };
    (@init $ty:ty; $n:literal, $h:literal $(, unit $u:ident)?, init $init:expr) => { $init };
    (@init $ty:ty; nested) => { <$ty as ::core::default::Default>::default() };
    (@init $ty:ty; not exported) => { <$ty as ::core::default::Default>::default() };
    (@init $ty:ty; not exported, init $init:expr) => { $init };
    (@register $r:ident, $f:expr; $n:literal, $h:literal $(, init $init:expr)?) => {
        $r.register($n, $h, ::core::clone::Clone::clone(&$f))
    };
    (@register $r:ident, $f:expr; $n:literal, $h:literal, unit $u:ident $(, init $init:expr)?) => {
        $r.register_with_unit($n, $h, $crate::metric::Unit::$u, ::core::clone::Clone::clone(&$f))
    };
    (@register $r:ident, $f:expr; nested) => { $f.register($r) };
    (@register $r:ident, $f:expr; not exported $(, init $init:expr)?) => {};
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::{counter::Counter, gauge::Gauge, histogram::Histogram};

    crate::metrics! {
        #[derive(Debug)]
        pub(crate) struct Inner {
            pub inner: Counter => ("inner", "Counted inside"),
        }
    }

    crate::metrics! {
        #[derive(Debug)]
        pub(crate) struct Counts {
            pub sent: Counter => ("sent", "Messages sent"),
            pub latency: Histogram => ("latency", "From send to ack", unit Seconds,
                init Histogram::new([0.01, 0.1, 1.0].into_iter())),
            pub size: Gauge => ("size", "What it holds", unit Bytes),
            pub inner: Inner => (nested),
            pub up: Gauge => (not exported, init { let g = Gauge::default(); g.set(1); g }),
        }
    }

    #[test]
    fn each_field_is_registered_once_with_its_name_help_unit_and_first_value() {
        let mut registry = prometheus_client::registry::Registry::default();
        let counts = Counts::default();
        counts.register(&mut registry);
        counts.sent.inc();
        counts.inner.inner.inc_by(2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "# HELP sent Messages sent.",
            "sent_total 1",
            "# UNIT latency_seconds seconds",
            "latency_seconds_count 0",
            "# UNIT size_bytes bytes",
            "size_bytes 0",
            "inner_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
        }
        assert_eq!(counts.up.get(), 1, "init sets the first value");
        assert!(!text.contains("up"), "a field not exported is not registered:\n{text}");
    }
}
