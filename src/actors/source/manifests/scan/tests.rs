use super::*;

use tempfile::TempDir;

use super::super::decode::Held;
use super::super::testing::*;
use crate::msgs::source::Change;

/// The Node at start: from the first file by name that holds it whole
/// and is valid, as the first scan would take it; files without it
/// (or only another Node) are not decoded.
#[test]
fn find_node_takes_our_node_from_the_first_valid_file_holding_it() {
    let dir = TempDir::new().unwrap();
    let find = |dir: &TempDir| ManifestDir::new(dir.path()).find_node("demo-node").unwrap();
    assert_eq!(find(&dir), None);
    write(&dir, "a-web.yaml", WEB_SERVICE);
    write(&dir, "b-other.yaml", &NODE.replace("demo-node", "other-node"));
    assert_eq!(find(&dir), None, "another node's Node is not ours");
    // Invalid as a whole (the scan skips it), though it names our Node.
    let broken = NODE.replace("10.244.0.0/24", "10.244.7.0/24");
    write(&dir, "c-broken.yaml", &format!("{broken}---\nkind: Service\n"));
    write(
        &dir,
        "d-list.yaml",
        &format!("apiVersion: v1\nkind: NodeList\nitems:\n  - {}", NODE.replace('\n', "\n    ")),
    );
    write(&dir, "e-node.yaml", &NODE.replace("10.244.0.0/24", "10.244.9.0/24"));
    let node = find(&dir).expect("our Node");
    let pod_cidr = node.spec.as_ref().and_then(|s| s.pod_cidr.as_deref());
    assert_eq!(pod_cidr, Some("10.244.0.0/24"), "the list in d-list.yaml comes first");
    let first_scan = ManifestDir::new(dir.path()).scan();
    let scanned = first_scan.events.iter().find_map(|e| match e {
        SourceEvent::Node(Change::Applied(n)) => Some(n.clone()),
        _ => None,
    });
    assert_eq!(scanned, Some(node), "as the first scan has it");
}

/// What the source keeps between scans: identities, not whole objects.
#[test]
fn only_identities_are_kept_between_scans() {
    let dir = TempDir::new().unwrap();
    write(&dir, "a.yaml", &service("web", "10.96.0.1"));
    let (manifests, _) = first_scan(&dir);
    let held: Vec<&Held> = manifests.current.values().collect();
    assert!(matches!(held[..], [Held { object: None, .. }]), "{held:?}");
    let file = manifests.files.values().next().unwrap();
    assert!(file.objects.values().all(|h| h.object.is_none()));
}

/// A file's cache finds each of its objects by key, whatever their order
/// in the file, and holds exactly them.
#[test]
fn a_files_cache_finds_each_of_its_objects_by_key() {
    let dir = TempDir::new().unwrap();
    let names = ["web", "api", "db", "cache"];
    let text: Vec<String> = names.iter().enumerate().map(|(i, n)| service(n, &format!("10.96.0.{}", i + 1))).collect();
    write(&dir, "a.yaml", &text.join("---\n"));
    let (manifests, _) = first_scan(&dir);
    let file = manifests.files.values().next().unwrap();
    assert_eq!(file.objects.keys().count(), names.len());
    for key in manifests.current.keys() {
        assert!(file.objects.get(key).is_some(), "{key}");
    }
    let keys: Vec<&ObjectKey> = file.objects.keys().collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "sorted: {keys:?}");
}

#[test]
fn only_visible_manifest_files_are_read() {
    let dir = TempDir::new().unwrap();
    write(&dir, "a.yml", &service("a", "10.96.0.1"));
    write(&dir, ".hidden.yaml", &service("hidden", "10.96.0.2"));
    write(&dir, "notes.txt", &service("txt", "10.96.0.3"));
    write(&dir, "a.yaml~", &service("backup", "10.96.0.4"));
    fs::create_dir(dir.path().join("sub.yaml")).unwrap();
    fs::write(dir.path().join("sub.yaml/b.yaml"), service("nested", "10.96.0.5")).unwrap();
    let (_, result) = first_scan(&dir);
    assert_eq!(changes(result), ["applied Service default/a"]);
}

#[test]
fn synced_is_emitted_once_for_each_kind_after_the_first_scan() {
    let dir = TempDir::new().unwrap();
    write(&dir, "svc.yaml", WEB_SERVICE);
    let (mut manifests, result) = first_scan(&dir);
    let lines = summary(&result.events);
    assert_eq!(
        lines,
        ["applied Service default/web", "synced Service", "synced EndpointSlice", "synced Node", "synced ServiceCIDR"]
    );
    write(&dir, "node.yaml", NODE);
    assert_eq!(summary(&manifests.scan().events), ["applied Node demo-node"]);
}

#[test]
fn the_file_by_file_scan_sends_each_file_as_read_and_ends_like_a_whole_scan() {
    let dir = TempDir::new().unwrap();
    write(&dir, "a.yaml", &format!("{WEB_SERVICE}---\n{WEB_SLICE}"));
    // The same Service again in a later file: refused, the first kept.
    write(&dir, "b.yaml", &format!("{}---\n{NODE}", service("web", "10.96.0.99")));
    let mut manifests = ManifestDir::new(dir.path()).with_settle(Duration::ZERO);
    let mut calls = Vec::new();
    manifests.scan_file_by_file(|r| calls.push((summary(&r.events), r.refused.len()))).unwrap();
    assert_eq!(
        calls,
        [
            (vec!["applied Service default/web".to_string(), "applied EndpointSlice default/web-abcde".into()], 0),
            (vec!["applied Node demo-node".into()], 1),
            (
                vec![
                    "synced Service".into(),
                    "synced EndpointSlice".into(),
                    "synced Node".into(),
                    "synced ServiceCIDR".into()
                ],
                0
            ),
        ]
    );
    // Nothing left for the next scan; later changes come as before.
    assert!(manifests.scan().events.is_empty());
    fs::remove_file(dir.path().join("a.yaml")).unwrap();
    let events = summary(&manifests.scan().events);
    assert_eq!(events, ["applied Service default/web", "deleted EndpointSlice default/web-abcde"]);
}

/// A Service as one JSON list item.
fn json_service(name: &str, ip: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}","namespace":"default"}},"spec":{{"clusterIP":"{ip}","ports":[{{"port":80}}]}}}}"#
    )
}

/// A list as `kubectl get -o json` writes it: items before the list's kind.
fn json_list(items: &[String]) -> String {
    format!(r#"{{"apiVersion":"v1","items":[{}],"kind":"List"}}"#, items.join(","))
}

/// The first scan's calls, each its events and how many copies it refused.
fn first_scan_calls(dir: &TempDir, chunks: Chunks) -> Vec<(Vec<String>, usize)> {
    let mut manifests = ManifestDir::new(dir.path()).with_settle(Duration::ZERO).with_chunks(chunks);
    let mut calls = Vec::new();
    manifests.scan_file_by_file(|r| calls.push((summary(&r.events), r.refused.len()))).unwrap();
    calls
}

#[test]
fn a_large_file_is_handed_over_a_chunk_at_a_time_with_the_same_events() {
    let dir = TempDir::new().unwrap();
    write(&dir, "a.yaml", &service("s1", "10.96.0.1"));
    let mut items: Vec<String> = (0..5).map(|i| json_service(&format!("s{i}"), &format!("10.96.1.{i}"))).collect();
    // Later copies: of s1 in the same file (refused), and s1 is in a.yaml first.
    items.push(json_service("s3", "10.96.9.9"));
    write(&dir, "b.json", &json_list(&items));
    let chunked = first_scan_calls(&dir, Chunks { file_bytes: 0, objects: 2 });
    let whole = first_scan_calls(&dir, Chunks::default());
    let applied = |n: &[usize]| n.iter().map(|i| format!("applied Service default/s{i}")).collect::<Vec<_>>();
    let synced = summary(&ResourceKind::ALL.map(SourceEvent::Synced));
    assert_eq!(
        chunked,
        [
            // Each file as read, in chunks, then what is left of it (nothing).
            (applied(&[1]), 0),
            (vec![], 0),
            // s0 and s1 read (s1 is a.yaml's), then s2 and s3, then s4; the second s3 is not handed over.
            (applied(&[0]), 2),
            (applied(&[2, 3]), 0),
            (applied(&[4]), 0),
            (vec![], 0),
            (synced.clone(), 0),
        ]
    );
    assert_eq!(whole, [(applied(&[1]), 0), (applied(&[0, 2, 3, 4]), 2), (synced, 0)]);
}

#[test]
fn a_large_file_with_a_bad_object_hands_over_nothing() {
    let dir = TempDir::new().unwrap();
    let mut items: Vec<String> = (0..5).map(|i| json_service(&format!("s{i}"), &format!("10.96.1.{i}"))).collect();
    items.push(r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"bad"},"spec":{"ports":"80"}}"#.into());
    write(&dir, "b.json", &json_list(&items));
    let mut manifests =
        ManifestDir::new(dir.path()).with_settle(Duration::ZERO).with_chunks(Chunks { file_bytes: 0, objects: 2 });
    let mut events = Vec::new();
    let mut errors = Vec::new();
    manifests
        .scan_file_by_file(|r| {
            events.extend(summary(&r.events));
            errors.extend(r.errors.iter().map(|e| e.to_string()));
        })
        .unwrap();
    assert_eq!(events, summary(&ResourceKind::ALL.map(SourceEvent::Synced)));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("b.json") && errors[0].contains("items[5]"), "{errors:?}");
}

#[test]
fn an_empty_directory_is_synced() {
    let dir = TempDir::new().unwrap();
    let (_, result) = first_scan(&dir);
    assert_eq!(
        summary(&result.events),
        ["synced Service", "synced EndpointSlice", "synced Node", "synced ServiceCIDR"]
    );
}

#[test]
fn a_file_that_turns_malformed_keeps_its_objects() {
    let dir = TempDir::new().unwrap();
    write(&dir, "web.yaml", &format!("{WEB_SERVICE}---\n{WEB_SLICE}"));
    let (mut manifests, _) = first_scan(&dir);
    write(&dir, "web.yaml", "apiVersion: v1\nkind: Service\nspec: [\n");
    let result = manifests.scan();
    assert!(result.events.is_empty(), "{:?}", summary(&result.events));
    assert_eq!(result.errors.len(), 1);
    // Reported once, not again while the file stays the same.
    assert!(manifests.scan().errors.is_empty());
    // Fixed again without the slice: now the slice goes.
    write(&dir, "web.yaml", WEB_SERVICE);
    assert_eq!(changes(manifests.scan()), ["deleted EndpointSlice default/web-abcde"]);
}

#[test]
fn deleting_a_file_deletes_its_objects() {
    let dir = TempDir::new().unwrap();
    write(&dir, "web.yaml", &format!("{WEB_SERVICE}---\n{WEB_SLICE}"));
    write(&dir, "node.yaml", NODE);
    let (mut manifests, _) = first_scan(&dir);
    fs::remove_file(dir.path().join("web.yaml")).unwrap();
    let result = manifests.scan();
    assert_eq!(summary(&result.events), ["deleted Service default/web", "deleted EndpointSlice default/web-abcde"]);
    let SourceEvent::Service(Change::Deleted(web)) = &result.events[0] else {
        panic!("not a deleted Service");
    };
    assert_eq!(web.metadata.name.as_deref(), Some("web"), "a deletion names the object");
}

#[test]
fn editing_one_object_emits_exactly_one_applied() {
    let dir = TempDir::new().unwrap();
    let text = format!("{}---\n{}", service("a", "10.96.0.1"), service("b", "10.96.0.2"));
    write(&dir, "svc.yaml", &text);
    write(&dir, "node.yaml", NODE);
    let (mut manifests, _) = first_scan(&dir);
    // Same size, written right after the first read: found by content.
    write(&dir, "svc.yaml", &text.replace("10.96.0.2", "10.96.0.3"));
    let result = manifests.scan();
    assert_eq!(changes(result), ["applied Service default/b"]);
}

#[test]
fn an_unchanged_rescan_emits_nothing() {
    let dir = TempDir::new().unwrap();
    write(&dir, "web.yaml", &format!("{WEB_SERVICE}---\n{WEB_SLICE}"));
    let (mut manifests, _) = first_scan(&dir);
    let result = manifests.scan();
    assert!(result.events.is_empty() && result.errors.is_empty());
    // Rewriting the same content, or reformatting it, changes no object.
    write(&dir, "web.yaml", &format!("# reformatted\n{WEB_SERVICE}---\n{WEB_SLICE}"));
    let result = manifests.scan();
    assert!(result.events.is_empty() && result.errors.is_empty());
}

#[test]
fn services_come_before_endpoint_slices() {
    let dir = TempDir::new().unwrap();
    write(&dir, "a-slice.yaml", WEB_SLICE);
    write(&dir, "b-node.yaml", NODE);
    write(&dir, "c-service.yaml", WEB_SERVICE);
    let (_, result) = first_scan(&dir);
    assert_eq!(
        changes(result),
        ["applied Service default/web", "applied EndpointSlice default/web-abcde", "applied Node demo-node",]
    );
}

#[test]
fn the_first_file_in_name_order_wins_and_the_other_is_refused() {
    let dir = TempDir::new().unwrap();
    write(&dir, "a.yaml", &service("web", "10.96.0.1"));
    write(&dir, "b.yaml", &service("web", "10.96.0.2"));
    let (mut manifests, result) = first_scan(&dir);
    assert_eq!(applied_cluster_ips(&result.events), ["10.96.0.1"]);
    let refused = &result.refused;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!((refused[0].kind.as_str(), refused[0].object.as_str()), ("Service", "default/web"));
    assert!(refused[0].detail.contains("b.yaml") && refused[0].detail.contains("a.yaml"), "{refused:?}");
    // Editing the refused copy changes nothing.
    write(&dir, "b.yaml", &service("web", "10.96.0.9"));
    assert!(manifests.scan().events.is_empty());
    // Removing the first brings in the other (read again: only its
    // identity was kept between scans).
    fs::remove_file(dir.path().join("a.yaml")).unwrap();
    let result = manifests.scan();
    assert_eq!(applied_cluster_ips(&result.events), ["10.96.0.9"]);
    assert_eq!(changes(result), ["applied Service default/web"]);
    // And deleting that one too deletes the object.
    fs::remove_file(dir.path().join("b.yaml")).unwrap();
    assert_eq!(changes(manifests.scan()), ["deleted Service default/web"]);
}

#[test]
fn a_configmap_style_symlink_swap_is_seen() {
    use std::os::unix::fs::symlink;
    let dir = TempDir::new().unwrap();
    let (root, link) = (dir.path(), dir.path().join("..data"));
    for (version, ip) in [("..v1", "10.96.0.1"), ("..v2", "10.96.0.2")] {
        fs::create_dir(root.join(version)).unwrap();
        fs::write(root.join(version).join("svc.yaml"), service("web", ip)).unwrap();
    }
    symlink("..v1", &link).unwrap();
    symlink("..data/svc.yaml", root.join("svc.yaml")).unwrap();
    let (mut manifests, result) = first_scan(&dir);
    assert_eq!(changes(result), ["applied Service default/web"]);
    // The kubelet's atomic update: a new ..data link renamed over the old.
    symlink("..v2", root.join("..data_tmp")).unwrap();
    fs::rename(root.join("..data_tmp"), &link).unwrap();
    let result = manifests.scan();
    assert_eq!(applied_cluster_ips(&result.events), ["10.96.0.2"]);
    assert_eq!(changes(result), ["applied Service default/web"]);
}

#[test]
fn an_unreadable_directory_changes_nothing() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("manifests");
    fs::create_dir(&path).unwrap();
    fs::write(path.join("svc.yaml"), WEB_SERVICE).unwrap();
    let mut manifests = ManifestDir::new(&path);
    manifests.scan();
    fs::rename(&path, dir.path().join("elsewhere")).unwrap();
    let result = manifests.scan();
    assert!(result.events.is_empty());
    assert!(matches!(result.errors[..], [ManifestError::ReadDir { .. }]));
}

/// A scanned directory with a settle time, after its first scan.
fn settling(dir: &TempDir, settle: Duration) -> ManifestDir {
    let mut manifests = ManifestDir::new(dir.path()).with_settle(settle);
    manifests.scan();
    manifests
}

#[test]
fn a_file_written_in_place_is_read_once_quiet() {
    let dir = TempDir::new().unwrap();
    let mut manifests = settling(&dir, Duration::from_millis(400));
    write(&dir, "web.yaml", &service("web", "10.96.0.1"));
    let result = manifests.scan();
    assert!(result.events.is_empty(), "{:?}", summary(&result.events));
    let wait = result.settle_again.expect("asked to scan again");
    assert!(wait <= Duration::from_millis(400) && !wait.is_zero(), "{wait:?}");
    std::thread::sleep(wait + Duration::from_millis(20));
    let result = manifests.scan();
    assert_eq!(changes(result), ["applied Service default/web"]);
}

#[test]
fn a_file_renamed_into_place_is_read_at_once() {
    let dir = TempDir::new().unwrap();
    let mut manifests = settling(&dir, Duration::from_secs(5));
    write(&dir, "web.yaml.tmp", &service("web", "10.96.0.1"));
    // The rename must come after the write by more than the kernel's
    // timestamp granularity (a clock tick) for ctime to tell.
    std::thread::sleep(Duration::from_millis(30));
    fs::rename(dir.path().join("web.yaml.tmp"), dir.path().join("web.yaml")).unwrap();
    let result = manifests.scan();
    assert_eq!(result.settle_again, None);
    assert_eq!(changes(result), ["applied Service default/web"]);
}

/// The issue's case: a file rewritten in place in two writes, the first
/// half valid YAML on its own. Nothing is deleted in between.
#[test]
fn a_half_written_file_deletes_nothing() {
    let dir = TempDir::new().unwrap();
    let both = format!("{}---\n{}", service("web", "10.96.0.1"), service("api", "10.96.0.2"));
    write(&dir, "svc.yaml", &both);
    let mut manifests = ManifestDir::new(dir.path()).with_settle(Duration::from_millis(300));
    assert_eq!(changes(manifests.scan()), ["applied Service default/api", "applied Service default/web"]);
    std::thread::sleep(Duration::from_millis(30));
    write(&dir, "svc.yaml", &service("web", "10.96.0.1"));
    assert!(manifests.scan().events.is_empty(), "the first half is not read");
    std::thread::sleep(Duration::from_millis(100));
    write(&dir, "svc.yaml", &both);
    assert!(manifests.scan().events.is_empty());
    std::thread::sleep(Duration::from_millis(350));
    let result = manifests.scan();
    assert!(result.events.is_empty(), "the whole file is what it was: {:?}", summary(&result.events));
    assert_eq!(result.settle_again, None);
}

/// A file hashed as it is read, piece by piece, has the hash of its bytes
/// read whole: a rescan that finds a file unchanged that way reads it no
/// further.
#[test]
fn a_file_hashed_in_pieces_has_the_hash_of_its_whole_content() {
    let dir = TempDir::new().unwrap();
    for len in [0, 1, HASH_PIECE - 1, HASH_PIECE, HASH_PIECE + 1, 3 * HASH_PIECE + 17] {
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let path = dir.path().join("f.json");
        fs::write(&path, &bytes).unwrap();
        assert_eq!(hash_file(&path).unwrap(), content_hash(&bytes), "{len} bytes");
    }
    let other = dir.path().join("g.json");
    fs::write(&other, b"{}").unwrap();
    assert_ne!(hash_file(&other).unwrap(), content_hash(b"{ }"));
}
