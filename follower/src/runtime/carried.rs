//! [`Carried`]: the entry bytes an event hands the protocol along with
//! it (the protocol sees only their metas; `Action::Persist` stores the
//! bytes).

use lockstep_common::control::FetchedEntry;

/// Entries an event carries the bytes of (a ring batch, a fetch's
/// answer): [`crate::protocol::Action::Persist`] stores them.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Carried<'a> {
    /// None.
    Nothing,
    /// Read from the own ring.
    Ring(&'a [FetchedEntry]),
    /// Fetched from `peer`.
    Fetched {
        /// The peer.
        peer: u64,
        /// The entries.
        entries: &'a [FetchedEntry],
    },
}

impl Carried<'_> {
    pub(super) fn entries(&self) -> &[FetchedEntry] {
        match self {
            Carried::Nothing => &[],
            Carried::Ring(e) => e,
            Carried::Fetched { entries, .. } => entries,
        }
    }
}
