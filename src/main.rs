/// Small over-aligned blocks (tokio's tasks and socket registrations) from slabs, the rest
/// from the system: see `aligned_alloc`.
#[global_allocator]
static ALLOCATOR: kamal_proxy::aligned_alloc::AlignedSlabs =
    kamal_proxy::aligned_alloc::AlignedSlabs::new();

fn main() {
    std::process::exit(kamal_proxy::cli::main());
}
