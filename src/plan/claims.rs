//! Desired kernel objects with the service ports that want them.
//!
//! Several service ports can want the same object (two ports of one Service
//! share its cluster IP on kube-ipvs0; two Services can share an LB VIP), so
//! each object records its claimants. The effective value is the one of the
//! lowest claimant, so the outcome never depends on event order. Changing
//! one claimant touches only its own keys: this is what keeps a sync
//! proportional to the change.

use std::collections::HashMap;
use std::hash::Hash;

/// An interned service port.
pub type Owner = u32;

#[derive(Debug)]
pub struct Claims<K, V> {
    map: HashMap<K, Vec<(Owner, V)>>,
}

impl<K, V> Default for Claims<K, V> {
    fn default() -> Self {
        Claims { map: HashMap::new() }
    }
}

/// How one key's effective value moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moved<V> {
    Added(V),
    Changed(V),
    Removed,
}

impl<K: Hash + Eq + Clone, V: Clone + PartialEq> Claims<K, V> {
    pub fn effective(&self, k: &K) -> Option<&V> {
        self.map.get(k).and_then(|c| c.first()).map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every key with its effective value.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter().filter_map(|(k, c)| c.first().map(|(_, v)| (k, v)))
    }

    fn claim(&mut self, k: K, owner: Owner, v: V) {
        let c = self.map.entry(k).or_default();
        match c.binary_search_by_key(&owner, |(o, _)| *o) {
            Ok(i) => c[i].1 = v,
            Err(i) => c.insert(i, (owner, v)),
        }
    }

    fn release(&mut self, k: &K, owner: Owner) {
        if let Some(c) = self.map.get_mut(k) {
            if let Ok(i) = c.binary_search_by_key(&owner, |(o, _)| *o) {
                c.remove(i);
            }
            if c.is_empty() {
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
}
