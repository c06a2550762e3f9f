//! Test kit pieces that are not fixtures: the in-process API server the
//! integration tests and `kpr-bench daemon --source api` run the daemon
//! against, the counting allocator of the memory tests, and the comparison
//! of `nft list table` listings that the nftables tests and `kpr-bench
//! nftables` share.

pub mod apiserver;
pub mod counting;

use std::collections::BTreeSet;

/// The chains, sets and maps of an `nft list table` listing, each as its
/// text: listings compared as these ignore the order objects were created
/// in (a full sync sent as several transactions creates them in another
/// order than one `nft -f` does).
pub fn listing_blocks(listing: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut current = String::new();
    for line in listing.lines() {
        if line.starts_with("\tchain ") || line.starts_with("\tset ") || line.starts_with("\tmap ") {
            current = String::new();
        }
        current.push_str(line);
        current.push('\n');
        if line == "\t}" {
            out.insert(std::mem::take(&mut current));
        }
    }
    out
}
