fn main() {
    eprintln!("gpunode-probe: not implemented yet");
    std::process::exit(2);
}
