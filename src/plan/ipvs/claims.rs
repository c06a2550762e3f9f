//! Desired kernel objects with the service ports that want them.
//!
//! Several service ports can want the same object (two ports of one Service
//! share its cluster IP on kube-ipvs0; two Services can share an LB VIP), so
//! each object records its claimants. The effective value is the one of the
//! lowest claimant, so the outcome never depends on event order. Changing
//! one claimant touches only its own keys: this is what keeps a sync
//! proportional to the change.
//!
//! Memory matters here (a large cluster has hundreds of thousands of keys):
//! a key's lone claimant is stored inline, without an allocation of its own,
//! and [`GroupedClaims`] keeps keys that come in small groups (real servers
//! under their virtual server) in one sorted vector per group.

use std::collections::HashMap;
use std::hash::Hash;

/// An interned service port.
pub type Owner = u32;

/// How one key's effective value moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moved<V> {
    Added(V),
    Changed(V),
    Removed,
}

/// The claimants of one key, lowest owner first.
#[derive(Debug)]
enum Claimants<V> {
    /// Nearly every key has a single claimant.
    One(Owner, V),
    /// Two or more, sorted by owner.
    Many(Vec<(Owner, V)>),
}

impl<V> Claimants<V> {
    fn effective(&self) -> &V {
        match self {
            Claimants::One(_, v) => v,
            Claimants::Many(c) => &c[0].1,
        }
    }

    fn claim(&mut self, owner: Owner, v: V) {
        match self {
            Claimants::One(o, old) if *o == owner => *old = v,
            Claimants::Many(c) => match c.binary_search_by_key(&owner, |(o, _)| *o) {
                Ok(i) => c[i].1 = v,
                Err(i) => c.insert(i, (owner, v)),
            },
            Claimants::One(..) => {
                let Claimants::One(o, old) = std::mem::replace(self, Claimants::Many(Vec::new())) else {
                    unreachable!("matched One above")
                };
                let pair = if o < owner { [(o, old), (owner, v)] } else { [(owner, v), (o, old)] };
                *self = Claimants::Many(pair.into());
            }
        }
    }

    /// Drops `owner`'s claim; false when no claimant is left.
    fn release(&mut self, owner: Owner) -> bool {
        match self {
            Claimants::One(o, _) => *o != owner,
            Claimants::Many(c) => {
                if let Ok(i) = c.binary_search_by_key(&owner, |(o, _)| *o) {
                    c.remove(i);
                }
                if c.len() == 1 {
                    let Some((o, v)) = c.pop() else { unreachable!("one claimant left") };
                    *self = Claimants::One(o, v);
                }
                true
            }
        }
    }
}

#[derive(Debug)]
pub struct Claims<K, V> {
    map: HashMap<K, Claimants<V>>,
}

impl<K, V> Default for Claims<K, V> {
    fn default() -> Self {
        Claims { map: HashMap::new() }
    }
}

impl<K: Hash + Eq + Clone, V: Clone + PartialEq> Claims<K, V> {
    pub fn effective(&self, k: &K) -> Option<&V> {
        self.map.get(k).map(Claimants::effective)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every key with its effective value.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter().map(|(k, c)| (k, c.effective()))
    }

    fn claim(&mut self, k: K, owner: Owner, v: V) {
        match self.map.get_mut(&k) {
            Some(c) => c.claim(owner, v),
            None => {
                self.map.insert(k, Claimants::One(owner, v));
            }
        }
    }

    fn release(&mut self, k: &K, owner: Owner) {
        if let Some(c) = self.map.get_mut(k) {
            if !c.release(owner) {
                self.map.remove(k);
            }
        }
    }

    /// Replaces `owner`'s claims `old` by `new` and returns, for every key
    /// whose effective value moved, how it moved.
    pub fn replace(&mut self, owner: Owner, old: &[(K, V)], new: &[(K, V)]) -> Vec<(K, Moved<V>)> {
        let mut before: HashMap<K, Option<V>> = HashMap::with_capacity(old.len() + new.len());
        for (k, _) in old.iter().chain(new) {
            if !before.contains_key(k) {
                before.insert(k.clone(), self.effective(k).cloned());
            }
        }
        for (k, _) in old {
            self.release(k, owner);
        }
        for (k, v) in new {
            self.claim(k.clone(), owner, v.clone());
        }
        let mut moved = Vec::new();
        for (k, was) in before {
            let now = self.effective(&k);
            match (was, now) {
                (None, Some(v)) => moved.push((k, Moved::Added(v.clone()))),
                (Some(w), Some(v)) if w != *v => moved.push((k, Moved::Changed(v.clone()))),
                (Some(_), None) => moved.push((k, Moved::Removed)),
                _ => {}
            }
        }
        moved
    }
}

/// One claim in a group.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Claim<K, V> {
    key: K,
    owner: Owner,
    value: V,
}

/// Claims on keys `(G, K)` that come in small groups `G`, each group's
/// claims in one vector sorted by key then owner: a key's effective value
/// is the first of its run. A claim costs its key, owner and value, nothing
/// more: no hash-table slot, no allocation of its own.
#[derive(Debug)]
pub struct GroupedClaims<G, K, V> {
    groups: HashMap<G, Box<[Claim<K, V>]>>,
    /// Distinct keys.
    len: usize,
}

impl<G, K, V> Default for GroupedClaims<G, K, V> {
    fn default() -> Self {
        GroupedClaims { groups: HashMap::new(), len: 0 }
    }
}

impl<G: Hash + Eq + Ord + Copy, K: Ord + Copy, V: Clone + PartialEq> GroupedClaims<G, K, V> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every key with its effective value.
    pub fn iter(&self) -> impl Iterator<Item = ((G, K), &V)> {
        self.groups.iter().flat_map(|(g, claims)| effective(claims).map(move |c| ((*g, c.key), &c.value)))
    }

    /// Replaces `owner`'s claims `old` (all it claims now) by `new`, both
    /// sorted by key with no key twice, and returns, in key order, every key
    /// whose effective value moved and how.
    pub fn replace(&mut self, owner: Owner, old: &[((G, K), V)], new: &[((G, K), V)]) -> Vec<((G, K), Moved<V>)> {
        debug_assert!(old.windows(2).all(|w| w[0].0 < w[1].0), "old claims must be sorted and unique");
        debug_assert!(new.windows(2).all(|w| w[0].0 < w[1].0), "new claims must be sorted and unique");
        let mut moved = Vec::new();
        let (mut old, mut new) = (old, new);
        loop {
            let group = match (old.first(), new.first()) {
                (None, None) => break,
                (Some(((o, _), _)), Some(((n, _), _))) => *o.min(n),
                (Some(((g, _), _)), None) | (None, Some(((g, _), _))) => *g,
            };
            let in_group = |claims: &[((G, K), V)]| claims.iter().take_while(|((g, _), _)| *g == group).count();
            let (old_here, old_rest) = old.split_at(in_group(old));
            let (new_here, new_rest) = new.split_at(in_group(new));
            debug_assert!(
                self.groups
                    .get(&group)
                    .into_iter()
                    .flatten()
                    .filter(|c| c.owner == owner)
                    .map(|c| (c.key, &c.value))
                    .eq(old_here.iter().map(|((_, k), v)| (*k, v))),
                "old claims must be what the owner claims now"
            );
            self.replace_in_group(owner, group, new_here, &mut moved);
            (old, new) = (old_rest, new_rest);
        }
        moved
    }

    fn replace_in_group(&mut self, owner: Owner, group: G, new: &[((G, K), V)], moved: &mut Vec<((G, K), Moved<V>)>) {
        let old = self.groups.remove(&group).unwrap_or_default();
        let others = old.iter().filter(|c| c.owner != owner).cloned();
        let mine = new.iter().map(|((_, key), value)| Claim { key: *key, owner, value: value.clone() });
        let mut now: Vec<Claim<K, V>> = others.chain(mine).collect();
        now.sort_unstable_by_key(|c| (c.key, c.owner));
        self.diff(group, &old, &now, moved);
        if !now.is_empty() {
            self.groups.insert(group, now.into_boxed_slice());
        }
    }

    /// Reports how effective values moved from `old` to `now`, one group's claims.
    fn diff(&mut self, group: G, old: &[Claim<K, V>], now: &[Claim<K, V>], moved: &mut Vec<((G, K), Moved<V>)>) {
        let (mut before, mut after) = (effective(old).peekable(), effective(now).peekable());
        loop {
            match (before.peek(), after.peek()) {
                (None, None) => break,
                (Some(b), a) if a.is_none_or(|a| b.key < a.key) => {
                    moved.push(((group, b.key), Moved::Removed));
                    self.len -= 1;
                    before.next();
                }
                (b, Some(a)) if b.is_none_or(|b| a.key < b.key) => {
                    moved.push(((group, a.key), Moved::Added(a.value.clone())));
                    self.len += 1;
                    after.next();
                }
                (Some(b), Some(a)) => {
                    if b.value != a.value {
                        moved.push(((group, a.key), Moved::Changed(a.value.clone())));
                    }
                    before.next();
                    after.next();
                }
                (None, _) | (_, None) => unreachable!("a lone run is handled above"),
            }
        }
    }
}

/// The first claim of each key, which holds its effective value.
fn effective<K: PartialEq, V>(claims: &[Claim<K, V>]) -> impl Iterator<Item = &Claim<K, V>> {
    claims.iter().enumerate().filter(|(i, c)| *i == 0 || claims[i - 1].key != c.key).map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_key_stays_while_any_owner_claims_it() {
        let mut c: Claims<&str, ()> = Claims::default();
        assert_eq!(c.replace(1, &[], &[("ip", ())]), vec![("ip", Moved::Added(()))]);
        assert_eq!(c.replace(2, &[], &[("ip", ())]), vec![]);
        assert_eq!(c.replace(1, &[("ip", ())], &[]), vec![]);
        assert_eq!(c.replace(2, &[("ip", ())], &[]), vec![("ip", Moved::Removed)]);
        assert!(c.is_empty());
    }

    #[test]
    fn lowest_owner_wins_whatever_the_order() {
        let mut c: Claims<&str, u8> = Claims::default();
        c.replace(5, &[], &[("vs", 50)]);
        assert_eq!(c.replace(3, &[], &[("vs", 30)]), vec![("vs", Moved::Changed(30))]);
        assert_eq!(c.replace(3, &[("vs", 30)], &[]), vec![("vs", Moved::Changed(50))]);
        assert_eq!(c.effective(&"vs"), Some(&50));
    }

    #[test]
    fn unchanged_claims_move_nothing() {
        let mut c: Claims<&str, u8> = Claims::default();
        c.replace(1, &[], &[("a", 1), ("b", 2)]);
        assert_eq!(c.replace(1, &[("a", 1), ("b", 2)], &[("a", 1), ("b", 2)]), vec![]);
        let moved = c.replace(1, &[("a", 1), ("b", 2)], &[("a", 1), ("b", 3)]);
        assert_eq!(moved, vec![("b", Moved::Changed(3))]);
    }

    #[test]
    fn three_claimants_fall_back_in_owner_order() {
        let mut c: Claims<&str, u8> = Claims::default();
        for o in [7, 2, 5] {
            c.replace(o, &[], &[("k", o as u8)]);
        }
        assert_eq!(c.effective(&"k"), Some(&2));
        assert_eq!(c.replace(2, &[("k", 2)], &[]), vec![("k", Moved::Changed(5))]);
        assert_eq!(c.replace(7, &[("k", 7)], &[]), vec![]);
        assert_eq!(c.replace(5, &[("k", 5)], &[]), vec![("k", Moved::Removed)]);
        assert!(c.is_empty());
    }

    #[test]
    fn grouped_claims_move_like_claims() {
        let mut c: GroupedClaims<u8, char, u8> = GroupedClaims::default();
        let four = [((1, 'a'), 40), ((1, 'b'), 40), ((2, 'a'), 40)];
        assert_eq!(
            c.replace(4, &[], &four),
            vec![((1, 'a'), Moved::Added(40)), ((1, 'b'), Moved::Added(40)), ((2, 'a'), Moved::Added(40))]
        );
        // A lower owner takes over one key and adds another; a higher one only adds.
        let two = [((1, 'b'), 20), ((1, 'c'), 20)];
        assert_eq!(c.replace(2, &[], &two), vec![((1, 'b'), Moved::Changed(20)), ((1, 'c'), Moved::Added(20))]);
        assert_eq!(c.replace(9, &[], &[((1, 'a'), 90)]), vec![]);
        assert_eq!(c.len(), 4);
        let mut all: Vec<_> = c.iter().map(|(k, v)| (k, *v)).collect();
        all.sort();
        assert_eq!(all, vec![((1, 'a'), 40), ((1, 'b'), 20), ((1, 'c'), 20), ((2, 'a'), 40)]);
        // Owner 4 leaves group 1 and changes its value in group 2.
        assert_eq!(
            c.replace(4, &four, &[((2, 'a'), 41)]),
            vec![((1, 'a'), Moved::Changed(90)), ((2, 'a'), Moved::Changed(41))]
        );
        // Unchanged claims move nothing.
        assert_eq!(c.replace(2, &two, &two), vec![]);
        assert_eq!(c.replace(2, &two, &[]), vec![((1, 'b'), Moved::Removed), ((1, 'c'), Moved::Removed)]);
        c.replace(9, &[((1, 'a'), 90)], &[]);
        c.replace(4, &[((2, 'a'), 41)], &[]);
        assert!(c.is_empty());
        assert!(c.groups.is_empty());
    }
}
