fn main() {
    std::process::exit(kamal_proxy::cli::main());
}
