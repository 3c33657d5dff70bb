//! Each thread's zstd contexts, kept from one batch to the next.
//!
//! A context made per batch cost more than the batch: a bridge taking 1,000 batches a second
//! from 10,000 edges spent more of its CPU creating decompression contexts, with their fresh,
//! zeroed pages, than decompressing (`perf`, 2026-12-07). A context keeps the dictionary it
//! last loaded, so a thread that packs or unpacks one edge's batches in a row digests it once;
//! another dictionary (or none) is loaded over it. zstd shrinks a compression context whose
//! workspace stays far larger than its recent jobs need, so one large batch does not hold its
//! memory for good.

use std::cell::RefCell;
use std::io;

use zstd::bulk::{Compressor, Decompressor};

use super::ProtoError;

/// A context and what is loaded in it: the level (compression only) and the dictionary's
/// bytes (empty: none), compared in full. 4 KiB is cheap to compare, and loading the wrong one
/// would make batches nobody can read.
struct Loaded<C> {
    context: C,
    level: i32,
    dict: Vec<u8>,
}

thread_local! {
    static COMPRESSOR: RefCell<Option<Loaded<Compressor<'static>>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<Loaded<Decompressor<'static>>>> = const { RefCell::new(None) };
}

/// The context in `slot` if it has `level` and `dict` loaded, else a new one `make` sets up. A
/// context that failed to set up is dropped, not kept half set up.
fn loaded<'s, C>(
    slot: &'s mut Option<Loaded<C>>,
    level: i32,
    dict: &[u8],
    make: impl FnOnce() -> io::Result<C>,
) -> io::Result<&'s mut C> {
    if slot.as_ref().is_none_or(|l| l.level != level || l.dict != dict) {
        *slot = None;
        *slot = Some(Loaded { context: make()?, level, dict: dict.to_vec() });
    }
    Ok(&mut slot.as_mut().expect("set above").context)
}

/// `raw` compressed at `level` with `dict`, as `zstd::bulk::compress` with that dictionary.
pub(super) fn compress(raw: &[u8], level: i32, dict: Option<&[u8]>) -> Result<Vec<u8>, ProtoError> {
    let dict = dict.unwrap_or_default();
    COMPRESSOR
        .with_borrow_mut(|slot| {
            let context = loaded(slot, level, dict, || {
                let mut context = Compressor::new(level)?;
                context.set_dictionary(level, dict)?;
                Ok(context)
            })?;
            let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(raw.len()));
            context.compress_to_buffer(raw, &mut out)?;
            Ok(out)
        })
        .map_err(|e: io::Error| ProtoError::Encode(e.to_string()))
}

/// `body`'s frames decompressed with `dict` into `out`, at most its capacity: a frame that
/// would write past it fails ("Destination buffer is too small").
pub(super) fn decompress(body: &[u8], dict: Option<&[u8]>, out: &mut Vec<u8>) -> io::Result<usize> {
    let dict = dict.unwrap_or_default();
    DECOMPRESSOR.with_borrow_mut(|slot| {
        let context = loaded(slot, 0, dict, || {
            let mut context = Decompressor::new()?;
            context.set_dictionary(dict)?;
            Ok(context)
        })?;
        context.decompress_to_buffer(body, out)
    })
}
