//! nftables mode's kernel actor: a [`KernelActor`] over one family's
//! `kube-proxy` table ([`NftablesKernel`]: the kernel's through netlink,
//! or an in-memory one in tests). Its batches carry whole transactions,
//! each applied all or nothing; a `Verify` batch is the syncPeriod's cheap
//! drift check (the ruleset's generation, then the table's handle, use
//! count and flags). Besides batches it answers [`ListTable`]: the table's
//! chains and sets, read before a full sync is planned. Messages never
//! interleave (`AtomicResponse`).

use actix::prelude::*;

use super::kernel_actor::KernelActor;
use crate::kernel::nftables::Listed;
use crate::kernel::{KResult, NftablesKernel};

/// The table's chains and sets (none if there is no table).
#[derive(Debug, Message)]
#[rtype(result = "KResult<Listed>")]
pub struct ListTable;

impl<S: NftablesKernel> Handler<ListTable> for KernelActor<S> {
    type Result = AtomicResponse<Self, KResult<Listed>>;

    fn handle(&mut self, _: ListTable, _: &mut Context<Self>) -> Self::Result {
        self.stats().dequeued();
        let work = self.kernel().list();
        AtomicResponse::new(Box::pin(work.into_actor(self).map(|res, act, _| {
            if let Err(e) = &res {
                tracing::warn!(actor = %act.stats().name, error = %e, "listing the table failed");
            }
            res
        })))
    }
}
