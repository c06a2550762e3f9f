//! The heap the manifest source holds while the daemon starts from one
//! large manifest file, counted exactly by this test binary's allocator
//! (every allocation of the process; the one test here runs alone in it),
//! so the figures do not depend on the machine's load.
//!
//! The file is what `kpr-bench daemon --layout one-file --dual-every 2`
//! writes (one `kind: List` of every object), at 3,000 Services × 10
//! endpoints, every second Service dual-stack. Both readings of it at the
//! start, finding this node's Node and the first scan, decode every object
//! (a bad file is refused whole) but hold only the objects' identities
//! and a bounded number of decoded objects at once, not the whole file's;
//! a rescan that reads the file again only to see it unchanged holds a
//! piece of it at a time.

use kube_proxy_rs::actors::source::manifests::ManifestDir;
use kube_proxy_rs::bench::daemon_run::{write_manifests, Layout};
use kube_proxy_rs::bench::dual::dual_stack_every;
use kube_proxy_rs::bench::gen::{Cluster, ClusterSpec, THIS_NODE};
use kube_proxy_rs::testkit::counting::{self, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MB: f64 = 1024.0 * 1024.0;

/// The file's bytes and its objects' identities, beside
/// [`kube_proxy_rs::actors::source::manifests::Chunks`]' 1,000 decoded
/// objects at a time. Holding every decoded object of the file (as a
/// reading of the whole file into objects does) costs several times the
/// file's size; the bounds sit between, in multiples of the file's size.
#[test]
fn the_start_from_one_large_file_holds_its_outline_not_its_decoded_objects() {
    let spec = ClusterSpec { services: 3000, endpoints_per_service: 10, nodes: 100, seed: 1 };
    let events = dual_stack_every(&Cluster::new(spec).expect("cluster").initial_events(), 2);
    let dir = tempfile::TempDir::new().expect("a temporary directory");
    let objects = write_manifests(dir.path(), &events, Layout::OneFile).expect("manifests");
    drop(events);
    let file: u64 = (std::fs::read_dir(dir.path()).expect("listed"))
        .map(|entry| entry.expect("an entry").metadata().expect("metadata").len())
        .sum();
    let file = usize::try_from(file).expect("a file's size");

    let before = counting::mark();
    let node = ManifestDir::new(dir.path()).find_node(THIS_NODE).expect("a readable directory");
    let find = counting::peak() - before;
    assert!(node.is_some(), "the file holds {THIS_NODE}");
    drop(node);

    let mut manifests = ManifestDir::new(dir.path());
    let (mut handed, mut batches) = (0, 0);
    let before = counting::mark();
    manifests
        .scan_file_by_file(|result| {
            batches += 1;
            handed += result.events.len();
        })
        .expect("a readable directory");
    let scan = counting::peak() - before;

    // Touched: its stamp no longer tells it unchanged, so it is read again,
    // as hashed pieces.
    let path = std::fs::read_dir(dir.path()).expect("listed").next().expect("the file").expect("an entry").path();
    let touched = std::fs::File::options().append(true).open(&path).expect("the file opens");
    let past = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    touched.set_modified(past).expect("a new mtime");
    drop(touched);
    let before = counting::mark();
    let rescan = manifests.scan();
    let again = counting::peak() - before;
    assert!(rescan.events.is_empty() && rescan.errors.is_empty(), "{rescan:?}");

    eprintln!(
        "{objects} objects in {:.1} MB: finding the node held {:.1} MB at its peak, the first scan {:.1} MB \
         ({handed} events in {batches} batches), the rescan {:.2} MB",
        file as f64 / MB,
        find as f64 / MB,
        scan as f64 / MB,
        again as f64 / MB,
    );
    assert!(objects > 7000, "{objects} objects");
    assert!(find < 2 * file, "finding the node held {:.1} MB", find as f64 / MB);
    assert!(scan < 3 * file, "the first scan held {:.1} MB", scan as f64 / MB);
    assert!(again < file / 8, "the rescan of the unchanged file held {:.1} MB", again as f64 / MB);
}
