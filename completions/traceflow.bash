# bash completion for traceflow and kubectl-traceflow (pods, Services, namespaces and nodes
# come from the bundle named on the command line, TRACEFLOW_BUNDLE, or the current cluster)
_traceflow() {
    local cur="${COMP_WORDS[COMP_CWORD]}" IFS=$'\n'
    local -a out
    [[ "$cur" == "=" ]] && cur=""          # `--bundle=<TAB>`: readline completes after the =
    out=($("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
    if [[ "${out[0]}" == ":files" ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
        compopt -o filenames 2>/dev/null
    else
        COMPREPLY=("${out[@]}")
    fi
}
complete -F _traceflow traceflow kubectl-traceflow
