"""A real packet as the question: traces that start from a capture, and captures compared
with a trace.

    frames.py   the captured frame, typed (link, network, transport, the tunnel's outer
                header), decoded from the bytes of one frame; CaptureError names file and frame
    files.py    pcap and pcapng files read frame by frame (link type, interface, direction),
                --frame N, --filter BPF (libpcap's own compiler and matcher)
    tcpdump.py  the text tcpdump prints (-n, -en, -v, -i any), one or two lines
    start.py    a frame -> the Query: both ends resolved from its addresses, where it was
                seen (--seen-at or the pcapng interface), request or reply, what was taken
    compare.py  frames of a real capture against a trace's packets, hop by hop
"""
