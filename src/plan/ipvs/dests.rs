//! Real servers are not kept beside the service ports that want them: a
//! virtual server's real servers are the ones its claimants' contributions
//! name, each with the lowest claimant's value. Nearly every virtual server
//! has one claimant, whose old and new contributions give the moves
//! directly; a shared one (two Services on one LB VIP and port) takes its
//! other claimants' contributions, planned again from their inputs.

use std::cmp::Ordering;

use super::claims::{Moved, Owner};
use crate::msgs::{DestKey, DestSpec, VsKey};

/// A contribution's real servers: sorted by key, no key twice.
pub type Dests = [((VsKey, DestKey), DestSpec)];

/// How one real server moved.
pub type DestMove = ((VsKey, DestKey), Moved<DestSpec>);

/// The part of `dests` under virtual server `vs`.
pub fn under<'a>(dests: &'a Dests, vs: &VsKey) -> &'a Dests {
    let start = dests.partition_point(|((v, _), _)| v < vs);
    let len = dests[start..].partition_point(|((v, _), _)| v == vs);
    &dests[start..start + len]
}

/// One virtual server's part of [`Dests`], by real server.
pub fn keyed(dests: &Dests) -> impl Iterator<Item = (DestKey, DestSpec)> + '_ {
    dests.iter().map(|((_, k), v)| (*k, *v))
}

/// One virtual server's real servers claimed by several owners: each key
/// once with its lowest owner's value, sorted by key.
pub fn effective(mut claims: Vec<(DestKey, Owner, DestSpec)>) -> Vec<(DestKey, DestSpec)> {
    claims.sort_unstable_by_key(|(k, o, _)| (*k, *o));
    claims.dedup_by_key(|(k, _, _)| *k);
    claims.into_iter().map(|(k, _, v)| (k, v)).collect()
}

/// How the real servers of `vs` moved from `before` to `after` (each
/// sorted by key, no key twice), in key order, onto `out`.
pub fn moves(
    vs: VsKey,
    before: impl IntoIterator<Item = (DestKey, DestSpec)>,
    after: impl IntoIterator<Item = (DestKey, DestSpec)>,
    out: &mut Vec<DestMove>,
) {
    let (mut before, mut after) = (before.into_iter().peekable(), after.into_iter().peekable());
    loop {
        let order = match (before.peek(), after.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((b, _)), Some((a, _))) => b.cmp(a),
        };
        match order {
            Ordering::Less => {
                if let Some((b, _)) = before.next() {
                    out.push(((vs, b), Moved::Removed));
                }
            }
            Ordering::Greater => {
                if let Some((a, v)) = after.next() {
                    out.push(((vs, a), Moved::Added(v)));
                }
            }
            Ordering::Equal => {
                if let (Some((_, was)), Some((a, now))) = (before.next(), after.next()) {
                    if was != now {
                        out.push(((vs, a), Moved::Changed(now)));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vs(port: u16) -> VsKey {
        VsKey { addr: "10.96.0.1".parse().unwrap(), protocol: crate::net::Protocol::Tcp, port }
    }

    fn dest(last: u8) -> DestKey {
        DestKey { addr: std::net::IpAddr::from([10, 244, 0, last]), port: 8080 }
    }

    fn w(weight: i32) -> DestSpec {
        DestSpec { weight }
    }

    #[test]
    fn under_finds_one_virtual_servers_run() {
        let all = [((vs(80), dest(1)), w(1)), ((vs(443), dest(1)), w(1)), ((vs(443), dest(2)), w(1))];
        let mut all = all.to_vec();
        all.sort();
        assert_eq!(under(&all, &vs(443)).len(), 2);
        assert_eq!(under(&all, &vs(80)), &[((vs(80), dest(1)), w(1))]);
        assert!(under(&all, &vs(8080)).is_empty());
    }

    #[test]
    fn the_lowest_owner_gives_a_shared_real_servers_value() {
        let got = effective(vec![(dest(2), 9, w(9)), (dest(1), 7, w(7)), (dest(2), 3, w(3))]);
        assert_eq!(got, vec![(dest(1), w(7)), (dest(2), w(3))]);
    }

    #[test]
    fn moves_are_adds_changes_and_removals_in_key_order() {
        let before = [(dest(1), w(1)), (dest(2), w(1)), (dest(4), w(1))];
        let after = [(dest(2), w(5)), (dest(3), w(1)), (dest(4), w(1)), (dest(5), w(1))];
        let mut out = Vec::new();
        moves(vs(80), before, after, &mut out);
        assert_eq!(
            out,
            vec![
                ((vs(80), dest(1)), Moved::Removed),
                ((vs(80), dest(2)), Moved::Changed(w(5))),
                ((vs(80), dest(3)), Moved::Added(w(1))),
                ((vs(80), dest(5)), Moved::Added(w(1))),
            ]
        );
    }
}
