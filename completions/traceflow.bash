# bash completion for traceflow (generated from the CLI; do not edit)
_traceflow() {
    local cur prev cmd
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    cmd="${COMP_WORDS[1]}"
    if [[ ${COMP_CWORD} -eq 1 ]]; then
        COMPREPLY=($(compgen -W "audit check collect demo diff example-path nf-trace ovs-trace pod-to-pod pod-to-svc route-get --help --version" -- "$cur"))
        return
    fi
    case "$cmd" in
        audit)
            case "$prev" in
                --bundle|-b) COMPREPLY=($(compgen -f -- "$cur")); return;;
                --output|-o) COMPREPLY=($(compgen -W "table json" -- "$cur")); return;;
            esac
            COMPREPLY=($(compgen -W "--bundle -b --all-pods --output -o --width --help -h" -- "$cur"));;
        check)
            case "$prev" in
                --bundle|-b) COMPREPLY=($(compgen -f -- "$cur")); return;;
                --output|-o) COMPREPLY=($(compgen -W "table json" -- "$cur")); return;;
            esac
            COMPREPLY=($(compgen -W "--bundle -b --output -o --junit --traces --width --context --kubeconfig --save-bundle --timeout --deadline --ssh-config --insecure-accept-host-keys --help -h" -- "$cur"));;
        collect)
            case "$prev" in
                --via) COMPREPLY=($(compgen -W "auto exec ssh" -- "$cur")); return;;
            esac
            COMPREPLY=($(compgen -W "--output -o --namespace -n --selector -l --port -p --nodes --all-nodes --context --kubeconfig --via --ssh-config --insecure-accept-host-keys --timeout --deadline --parallel --help -h" -- "$cur"));;
        demo)
            case "$prev" in
                --output|-o) COMPREPLY=($(compgen -W "table json yaml" -- "$cur")); return;;
            esac
            COMPREPLY=($(compgen -W "--output -o --width --help -h" -- "$cur"));;
        diff)
            case "$prev" in
                --output|-o) COMPREPLY=($(compgen -W "table json" -- "$cur")); return;;
            esac
            COMPREPLY=($(compgen -W "--suite --all-pods --output -o --width --help -h" -- "$cur"));;
        example-path)
            case "$prev" in
            esac
            COMPREPLY=($(compgen -W "--help -h" -- "$cur"));;
        nf-trace)
            case "$prev" in
                --protocol) COMPREPLY=($(compgen -W "tcp udp sctp" -- "$cur")); return;;
                --bundle|-b) COMPREPLY=($(compgen -f -- "$cur")); return;;
                --output|-o) COMPREPLY=($(compgen -W "table json yaml" -- "$cur")); return;;
            esac
            COMPREPLY=($(compgen -W "--src --dst --dport --sport --protocol --hook --iif --oif --mark --bundle -b --output -o --width --help -h" -- "$cur"));;
        ovs-trace)
            case "$prev" in
                --bundle|-b) COMPREPLY=($(compgen -f -- "$cur")); return;;
                --output|-o) COMPREPLY=($(compgen -W "table json yaml" -- "$cur")); return;;
            esac
            COMPREPLY=($(compgen -W "--table --bundle -b --output -o --width --help -h" -- "$cur"));;
        pod-to-pod)
            case "$prev" in
                --protocol) COMPREPLY=($(compgen -W "tcp udp sctp" -- "$cur")); return;;
                --bundle|-b) COMPREPLY=($(compgen -f -- "$cur")); return;;
                --output|-o) COMPREPLY=($(compgen -W "table json yaml" -- "$cur")); return;;
            esac
            COMPREPLY=($(compgen -W "--namespace -n --port -p --protocol --src-port --no-reply --bundle -b --output -o --width --context --kubeconfig --save-bundle --timeout --deadline --ssh-config --insecure-accept-host-keys --help -h" -- "$cur"));;
        pod-to-svc)
            case "$prev" in
                --protocol) COMPREPLY=($(compgen -W "tcp udp sctp" -- "$cur")); return;;
                --bundle|-b) COMPREPLY=($(compgen -f -- "$cur")); return;;
                --output|-o) COMPREPLY=($(compgen -W "table json yaml" -- "$cur")); return;;
            esac
            COMPREPLY=($(compgen -W "--namespace -n --port -p --protocol --src-port --endpoint --no-reply --bundle -b --output -o --width --context --kubeconfig --save-bundle --timeout --deadline --ssh-config --insecure-accept-host-keys --help -h" -- "$cur"));;
        route-get)
            case "$prev" in
                --bundle|-b) COMPREPLY=($(compgen -f -- "$cur")); return;;
                --output|-o) COMPREPLY=($(compgen -W "table json yaml" -- "$cur")); return;;
            esac
            COMPREPLY=($(compgen -W "--from --iif --mark --bundle -b --output -o --width --help -h" -- "$cur"));;
    esac
}
complete -o default -F _traceflow traceflow kubectl-traceflow
